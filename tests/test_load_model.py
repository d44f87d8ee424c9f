"""load.model.load_model: every model from one weights source (`init.source`), by role.

The same weights written as an HF directory and as an Orbax run load to the same model,
for training and for decoding; an attribute model loads from its HF export and from its
run to the same predictions; a source of the wrong kind for the role is refused naming
the key; an Orbax run's shapes are read from it, not from `model.name`.
"""

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from helpsteer_jax import config_base, runtime, saved_params, weights
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.load import model as loader
from helpsteer_jax.models import builder, catalog, hf, peft_adapters, reward_hf
from helpsteer_jax.models.reward import reward_model

# not the `tiny` model's shape: whatever loads it must read the shape from the source
SHAPE = dict(hidden_size=48, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2)


def _config(source: str = "", **model) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      model=config_base.model_section("tiny", attention_block_size=32, **model),
      init=config_base.init_section(source=source, head="auto"), seed=0,
      mesh=config_base.mesh_config(1, 1, 1), sharding_rules=()))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  """The same random policy and attribute model, each as an HF directory and an Orbax run."""
  root = tmp_path_factory.mktemp("sources")
  cfg = catalog.model_config("tiny", initializer_range=0.2, **SHAPE)
  policy = builder.create(cfg, seed=1)
  hf.save_hf_model(policy, root / "policy_hf", dtype="float32")
  saved_params.save_params(root / "policy_run", nnx.to_pure_dict(nnx.state(policy, nnx.Param)), 3)
  rm = reward_model(cfg, seed=2)
  head = nnx.state(rm, nnx.Param)
  pure = nnx.to_pure_dict(head)
  pure["head"]["kernel"] = np.random.default_rng(0).normal(
      size=pure["head"]["kernel"].shape).astype(np.float32)
  nnx.replace_by_pure_dict(head, pure)
  nnx.update(rm, head)
  reward_hf.save_reward_hf(rm, root / "rm_hf", dtype="float32")
  saved_params.save_params(root / "rm_run", nnx.to_pure_dict(nnx.state(rm, nnx.Param)), 0)
  return root


def _params(model) -> dict:
  return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def test_one_key_takes_every_kind_and_detects_which(sources):
  for name, hf_kind, kind in [("policy_hf", True, weights.POLICY), ("policy_run", False,
                              weights.POLICY), ("rm_hf", True, weights.REWARD),
                              ("rm_run", False, weights.REWARD)]:
    section = config_base.init_section(source=str(sources / name))
    assert bool(weights.hf_dir(section)) == hf_kind and bool(weights.orbax_run(section)) != hf_kind
    assert weights.inspect(str(sources / name), "init.source").kind == kind, name
  assert not weights.hf_dir(config_base.init_section()) and not weights.orbax_run(
      config_base.init_section())


def test_a_policy_loads_the_same_from_its_hf_directory_and_its_run(sources):
  from_hf = _config(str(sources / "policy_hf"))
  from_run = _config(str(sources / "policy_run"))
  rt = runtime.setup(from_hf, jax.devices()[:1])
  a = loader.load_model(from_hf, rt, loader.TRAIN)
  b = loader.load_model(from_run, rt, loader.TRAIN)
  assert (b.cfg.hidden_size, b.cfg.num_layers) == (SHAPE["hidden_size"], SHAPE["num_layers"])
  jax.tree.map(np.testing.assert_array_equal, _params(a), _params(b))
  decode = loader.load_model(from_run, rt, loader.DECODE)
  jax.tree.map(np.testing.assert_array_equal, _params(a), _params(decode))
  assert runtime.model_config(from_run).hidden_size == SHAPE["hidden_size"]  # setup's too


def test_a_peft_adapter_on_an_orbax_base_is_kept_apart_for_training_merged_for_decoding(
    sources, tmp_path):
  config = _config(str(sources / "policy_run"))
  config.model.lora.rank = 4
  rt = runtime.setup(config, jax.devices()[:1])
  fresh = loader.load_model(config, rt, loader.TRAIN)
  adapters = jax.tree.map(lambda a: np.random.default_rng(0).normal(
      scale=0.5, size=a.shape).astype(np.float32), builder.adapter_params(fresh))
  adapters = jax.device_put(adapters)
  peft_adapters.save_adapters(fresh.cfg, adapters, tmp_path / "adapter")
  config.model.lora.update(rank=0, adapter=str(tmp_path / "adapter"))
  train = loader.load_model(config, rt, loader.TRAIN)
  decode = loader.load_model(config, rt, loader.DECODE)
  names = lambda m: {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(m, nnx.Param))}
  assert any("lora" in n for n in names(train)) and not any("lora" in n for n in names(decode))
  tokens = np.arange(1, 9, dtype=np.int32)[None]
  base = loader.load_model(_config(str(sources / "policy_run")), rt, loader.DECODE)
  assert np.abs(np.asarray(decode(tokens)) - np.asarray(base(tokens))).max() > 1e-3
  np.testing.assert_allclose(np.asarray(decode(tokens)), np.asarray(train(tokens)),
                             rtol=1e-4, atol=1e-4)  # W + BA summed before the matmul


def test_an_attribute_model_loads_the_same_from_its_hf_export_and_its_run(sources):
  rt = runtime.setup(_config(), jax.devices()[:1])
  a = loader.load_model(_config(str(sources / "rm_hf")), rt, loader.REWARD)
  b = loader.load_model(_config(str(sources / "rm_run")), rt, loader.REWARD)  # no shape flags
  jax.tree.map(np.testing.assert_array_equal, _params(a), _params(b))
  assert np.abs(_params(b)["head"]["kernel"]).sum() > 0  # the trained head, not zeros


@pytest.mark.parametrize("name", ["rm_hf", "rm_run"])
def test_an_attribute_model_is_not_a_policy(sources, name):
  config = _config(str(sources / name))
  rt = runtime.setup(config, jax.devices()[:1])
  with pytest.raises(ConfigError, match=r"init.source=.* is an attribute model"):
    loader.load_model(config, rt, loader.TRAIN)


def test_an_unknown_role_is_refused():
  with pytest.raises(ValueError, match="unknown role"):
    loader.load_model(_config(), None, "critic")


def test_a_run_of_lora_adapters_alone_is_refused_naming_what_to_set(sources, tmp_path):
  """A LoRA run's checkpoints hold its adapters, not the base they adapt."""
  config = _config(str(sources / "policy_run"))
  config.model.lora.rank = 4
  rt = runtime.setup(config, jax.devices()[:1])
  adapters = builder.adapter_params(loader.load_model(config, rt, loader.TRAIN))
  saved_params.save_params(tmp_path / "lora_run", adapters, 5)
  assert weights.inspect(str(tmp_path / "lora_run"), "init.source").lora
  with pytest.raises(ConfigError, match=r"LoRA adapters only.*model.lora.adapter"):
    loader.load_model(_config(str(tmp_path / "lora_run")), rt, loader.TRAIN)
