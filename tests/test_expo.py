"""ExPO (the expo task): theta_1 + alpha (theta_1 - theta_0) against a NumPy re-derivation, for a
policy (HF base, Orbax tuned run with a SteerLM export) and a reward model (two Orbax
attribute-model checkpoints); alpha 0 is theta_1 bit for bit; the outputs read back through
the existing loaders and in transformers; mismatched or LoRA sources are refused by name.
Tiny random models, fp32."""

import json
import runpy
import shutil

import jax
import ml_collections
import numpy as np
import pytest
import transformers
from torch_reference import needs_torch, torch

from helpsteer_jax import runtime, saved_params
from helpsteer_jax.data import chat_template
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.load import model as loader
from helpsteer_jax.load import reward as rm_lib
from helpsteer_jax.models import builder, catalog, hf
from helpsteer_jax.models.reward import reward_model
from helpsteer_jax.runs import expo_sources
from helpsteer_jax.scoring import load as scoring_load
from helpsteer_jax.tasks import expo

from conftest import REPO_ROOT

pytestmark = pytest.mark.version_tier

SPEC = chat_template.SteerSpec(("helpfulness", "verbosity"), {"helpfulness": 4, "verbosity": 2})


def expo_config(base, tuned, alpha="0,0.5"):
  cfg = runpy.run_path(str(REPO_ROOT / "configs" / "expo.py"))["get_config"]()
  cfg.model.update(name="tiny", attention_block_size=32)
  cfg.expo.update(base=str(base), tuned=str(tuned), alpha=alpha)
  return cfg


def flat(params) -> dict:
  leaves = jax.tree_util.tree_leaves_with_path(params)
  return {expo_sources.param_name(p): np.asarray(jax.device_get(v)) for p, v in leaves}


def load_orbax_policy(out, rt):
  """The policy at `out` through load.model (what generate / dpo2d / rl read)."""
  cfg = expo_config("", "")
  return loader.load_model(ml_collections.ConfigDict(dict(
      model=cfg.model, init={"source": str(out), "step": -1}, seed=0)), rt, loader.DECODE)


def check_formula(theta0, theta1, got, alpha):
  """Every leaf equals theta_1 + alpha (theta_1 - theta_0) (NumPy, float64) to 1e-6."""
  assert set(got) == set(theta1) == set(theta0)
  for name, t1 in theta1.items():
    t1, t0 = t1.astype(np.float64), theta0[name].astype(np.float64)
    np.testing.assert_allclose(got[name], t1 + alpha * (t1 - t0), atol=1e-6, rtol=1e-6,
                               err_msg=name)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
  return demo_tokenizer.build_demo_tokenizer(tmp_path_factory.mktemp("expo_tok") / "tok")


@pytest.fixture(scope="module")
def rt():
  return runtime.setup(expo_config("", ""))


@pytest.fixture(scope="module")
def policy(tmp_path_factory, tokenizer_dir, rt):
  """theta_0: an HF causal LM; theta_1: an Orbax run (step 7) with its SteerLM HF export."""
  root = tmp_path_factory.mktemp("expo_policy")
  cfg = catalog.model_config("tiny", attention_block_size=32)
  base = builder.init_model(cfg, rt.mesh, rt.rules, seed=0)
  hf.save_hf_model(base, root / "base", dtype="float32", tokenizer=tokenizer_dir)
  tuned = builder.init_model(cfg, rt.mesh, rt.rules, seed=1)
  run = root / "tuned_run"
  saved_params.save_params(run, expo._params(tuned), step=7)
  hf.save_hf_model(tuned, run / "hf", dtype="float32", tokenizer=tokenizer_dir)
  chat_template.export_files(SPEC, run / "hf", turn_marker=5)
  cfg = expo_config(root / "base", run)
  summary = expo.run(cfg, str(root / "expo"))
  return root, summary, flat(expo._params(base)), flat(expo._params(tuned))


@pytest.fixture(scope="module")
def reward(tmp_path_factory, tokenizer_dir):
  """Two Orbax attribute-model checkpoints (random backbones, random heads)."""
  root = tmp_path_factory.mktemp("expo_reward")
  cfg = catalog.model_config("tiny", attention_block_size=32)
  thetas = []
  for seed, name in ((0, "base_run"), (1, "tuned_run")):
    model = reward_model(cfg, seed)
    model.head.kernel.value = jax.random.normal(jax.random.key(seed), model.head.kernel.shape)
    params = expo._params(model)
    saved_params.save_params(root / name, params, step=3)
    shutil.copytree(tokenizer_dir, root / name / saved_params.DEMO_TOKENIZER)
    thetas.append(flat(params))
  summary = expo.run(expo_config(root / "base_run", root / "tuned_run", "0,0.3"),
                     str(root / "expo"))
  return root, summary, *thetas


def test_policy_expo_is_the_formula_and_alpha_0_is_theta_1(policy, rt):
  """The Orbax outputs, read back by load.model (what generate / dpo2d / rl use),
  are theta_1 + alpha (theta_1 - theta_0) per leaf; alpha 0 is theta_1's bytes."""
  root, summary, theta0, theta1 = policy
  assert summary["kind"] == expo_sources.POLICY and set(summary["outputs"]) == {"0", "0.5"}
  for alpha in (0.0, 0.5):
    out = root / "expo" / f"alpha_{alpha:g}"
    assert saved_params.resolve(out) == (out / "checkpoints", 7)
    got = flat(expo._params(load_orbax_policy(out, rt)))
    check_formula(theta0, theta1, got, alpha)
    if alpha == 0:
      for name, value in theta1.items():
        assert got[name].tobytes() == value.tobytes(), name


@needs_torch
def test_policy_hf_output_loads_in_transformers_with_our_logits(policy, rt):
  """alpha_0.5/hf: transformers' causal LM gives our model's logits (1e-4); it carries the
  tuned export's tokenizer, chat template, steerlm section and turn-marker EOS id."""
  root, *_ = policy
  out = root / "expo" / "alpha_0.5"
  ours = hf.load_hf_model(out / "hf")
  want = flat(expo._params(ours))
  for name, value in flat(expo._params(load_orbax_policy(out, rt))).items():
    assert value.tobytes() == want[name].tobytes(), name  # fp32: the HF copy is exact
  tokens = np.random.RandomState(0).randint(3, 1000, (2, 12))
  logits = np.asarray(ours.logits(ours(tokens)))
  model = transformers.AutoModelForCausalLM.from_pretrained(out / "hf", dtype=torch.float32)
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(theirs, logits, atol=1e-4, rtol=0)
  assert chat_template.read_spec(out / "hf") == SPEC
  assert (out / "hf" / chat_template.TEMPLATE_FILE).is_file()
  eos = json.loads((out / "hf" / "generation_config.json").read_text())["eos_token_id"]
  assert 5 in (eos if isinstance(eos, list) else [eos])


def test_reward_expo_extrapolates_backbone_and_head(reward, rt):
  """Reward model: backbone and head follow the formula; the Orbax output scores through
  scorer.source like its HF dir and head.npz; alpha 0 is theta_1's bytes."""
  root, summary, theta0, theta1 = reward
  assert summary["kind"] == expo_sources.REWARD
  for alpha in (0.0, 0.3):
    out = root / "expo" / f"alpha_{alpha:g}"
    model = scoring_load.load_reward_model(str(out), rt)
    got = flat(expo._params(model))
    check_formula(theta0, theta1, got, alpha)
    if alpha == 0:
      assert all(got[n].tobytes() == v.tobytes() for n, v in theta1.items())
    head = rm_lib.load_head(out / rm_lib.HEAD_FILE, 64)["kernel"]
    assert head.tobytes() == got["head/kernel"].tobytes()
    from_hf = flat(expo._params(scoring_load.load_reward_model(str(out / "hf"), rt)))
    for name, value in got.items():
      np.testing.assert_array_equal(from_hf[name], value, err_msg=name)


def test_mismatched_or_lora_sources_are_refused_before_loading(reward, policy, tmp_path):
  """A different shape names the first differing parameter; a policy against a reward
  model, a LoRA run, a PEFT adapter directory and an Orbax run read as another family
  (model.name) are refused with what to do."""
  root, *_ = reward
  cfg = catalog.model_config("tiny", attention_block_size=32, intermediate_size=128)
  saved_params.save_params(tmp_path / "wide", expo._params(reward_model(cfg, 0)), step=1)
  with pytest.raises(ConfigError, match=r"differ first at parameter backbone/layers/mlp/"):
    expo.run(expo_config(tmp_path / "wide", root / "tuned_run"), str(tmp_path / "out"))
  with pytest.raises(ConfigError, match="is a policy but expo.tuned.* is a reward model"):
    expo.run(expo_config(policy[0] / "base", root / "tuned_run"), str(tmp_path / "out"))
  lora = {"layers": {"attn": {"q_lora": {"a": np.zeros((2, 4), np.float32)}}}}
  saved_params.save_params(tmp_path / "lora", lora, step=1)
  with pytest.raises(ConfigError, match="LoRA run.*export_merged"):
    expo.run(expo_config(tmp_path / "lora", root / "tuned_run"), str(tmp_path / "out"))
  (tmp_path / "adapter").mkdir()
  (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
  with pytest.raises(ConfigError, match="PEFT adapter"):
    expo.run(expo_config(root / "base_run", tmp_path / "adapter"), str(tmp_path / "out"))
  wrong_family = expo_config(policy[0] / "base", policy[0] / "tuned_run")
  wrong_family.model.name = "smollm2_135m"
  with pytest.raises(ConfigError, match="rope_theta.*set --config.model.name"):
    expo.run(wrong_family, str(tmp_path / "out"))
  bad_dtype = expo_config(root / "base_run", root / "tuned_run")
  bad_dtype.expo.hf_dtype = "int8"
  with pytest.raises(ConfigError, match="expo.hf_dtype='int8'"):
    expo.run(bad_dtype, str(tmp_path / "out"))
  with pytest.raises(ConfigError, match="alpha"):
    expo.parse_alphas("0.1,x")
  assert expo.parse_alphas("0.1, 0.3,0.5") == [0.1, 0.3, 0.5]
  assert not (tmp_path / "out").exists()
