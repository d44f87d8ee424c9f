"""LoRA adapters: PEFT's definition, PEFT's file format, both directions.

References: `peft` (`PeftModel.from_pretrained` on transformers' PyTorch
causal LMs loads what we save; `get_peft_model` makes adapters we load;
`merge_and_unload` is the merged model), and the base model itself (fresh
adapters, or adapters switched off, change nothing). Models are tiny, random
and saved with `save_pretrained`; nothing is downloaded.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch_reference
import transformers
from torch_reference import needs_peft, peft, torch

from helpsteer_jax import sharding
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import builder, hf, lora, peft_adapters

pytestmark = pytest.mark.version_tier

ATOL = 1e-4
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
            initializer_range=0.2, attn_implementation="eager",
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _hf_config(kind: str):
  if kind == "llama":
    return transformers.LlamaConfig(**TINY, rms_norm_eps=1e-5)
  if kind == "qwen3":  # q/k norms, head_dim != hidden / heads
    return transformers.Qwen3Config(**TINY, head_dim=32)
  if kind == "gemma2":  # GeGLU, sandwich norms, soft-caps, sliding window
    return transformers.Gemma2Config(**{**TINY, "num_hidden_layers": 3}, head_dim=32,
                                     query_pre_attn_scalar=24, sliding_window=5,
                                     attn_logit_softcapping=2.0, final_logit_softcapping=8.0)
  raise ValueError(kind)


KINDS = ["llama", "qwen3", "gemma2"]


@pytest.fixture(scope="module", params=KINDS)
def base(request, tmp_path_factory):
  """A random transformers causal LM saved as an HF directory: (directory, torch model)."""
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(_hf_config(request.param)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
  out = tmp_path_factory.mktemp(request.param) / "base"
  model.save_pretrained(out)
  return out, model


@pytest.fixture(scope="module", params=KINDS)
def base_dir(request, tmp_path_factory):
  """A random causal LM of the same shape written by our HF export (no PyTorch needed)."""
  model = builder.create(hf.config_from_hf(_hf_config(request.param).to_dict()), seed=0)
  out = tmp_path_factory.mktemp(request.param) / "ours"
  hf.save_hf_model(model, out, dtype="float32")
  return out


def _mesh():
  return sharding.make_mesh((1, 1, 1), jax.devices()[:1])


def _tokens():
  rng = np.random.RandomState(0)
  tokens = rng.randint(0, TINY["vocab_size"], size=(2, 12)).astype(np.int32)
  return tokens, np.ones_like(tokens), np.broadcast_to(np.arange(12), tokens.shape).copy()


def _our_logits(model, tokens, positions) -> np.ndarray:
  hidden = model(jnp.asarray(tokens), jnp.asarray(positions))
  return np.asarray(model.logits(hidden), np.float32)


def _random_adapters(model, seed=1):
  """The model with every adapter matrix random (B too: a trained adapter, not a fresh one)."""
  from flax import nnx
  graphdef, adapters, rest = nnx.split(model, nnx.LoRAParam, ...)
  leaves, tree = jax.tree.flatten(nnx.to_pure_dict(adapters))
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  leaves = [0.2 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
  return nnx.merge(graphdef, jax.tree.unflatten(tree, leaves), rest)


@needs_peft
def test_our_adapters_load_in_peft_and_merge_as_peft_merges(base, tmp_path):
  base_dir, torch_model = base
  ours = hf.load_hf_model(base_dir)
  tokens, mask, positions = _tokens()
  base_logits = _our_logits(ours, tokens, positions)
  adapted = builder.with_adapters(ours, lora.LoraConfig(rank=4, alpha=8.0), _mesh(),
                                  sharding.DEFAULT_RULES, seed=3)
  # Fresh adapters (B = 0) and adapters switched off are the base model, exactly.
  np.testing.assert_array_equal(_our_logits(adapted, tokens, positions), base_logits)
  adapted = _random_adapters(adapted)
  with lora.disabled():
    np.testing.assert_array_equal(_our_logits(adapted, tokens, positions), base_logits)
  want = _our_logits(adapted, tokens, positions)
  assert np.abs(want - base_logits).max() > 1e-2  # the adapters matter

  out = peft_adapters.save_adapters(adapted.cfg, builder.adapter_params(adapted),
                                    tmp_path / "adapter", base_model=str(base_dir))
  config = json.loads((out / "adapter_config.json").read_text())
  assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["peft_type"] == "LORA"
  assert sorted(config["target_modules"]) == sorted(MODULES)
  fresh = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()
  theirs = peft.PeftModel.from_pretrained(fresh, out).eval()
  np.testing.assert_allclose(torch_reference.logits(theirs, tokens, mask, positions), want,
                             atol=ATOL, rtol=0)
  # Merged: our merge exported as a plain HF model == peft's merge_and_unload.
  merged_dir = tmp_path / "merged"
  hf.save_hf_model(builder.merge_adapters(adapted), merged_dir, dtype="float32")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(merged_dir).eval()
  np.testing.assert_allclose(
      torch_reference.logits(reloaded, tokens, mask, positions),
      torch_reference.logits(theirs.merge_and_unload(), tokens, mask, positions),
      atol=ATOL, rtol=0)


@needs_peft
def test_an_adapter_made_by_peft_loads_here(base, tmp_path):
  base_dir, _ = base
  fresh = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()
  torch.manual_seed(1)
  theirs = peft.get_peft_model(fresh, peft.LoraConfig(
      r=2, lora_alpha=6, target_modules=["q_proj", "v_proj", "down_proj"],
      init_lora_weights=False)).eval()  # B random too
  theirs.save_pretrained(tmp_path / "peft")
  tokens, mask, positions = _tokens()
  want = torch_reference.logits(theirs, tokens, mask, positions)

  ours = hf.load_hf_model(base_dir)
  lc, adapters = peft_adapters.read_adapters(tmp_path / "peft", ours.cfg)
  assert lc == lora.LoraConfig(rank=2, alpha=6.0, targets=("q", "v", "down"))
  adapted = builder.with_adapters(ours, lc, _mesh(), sharding.DEFAULT_RULES, adapters=adapters)
  np.testing.assert_allclose(_our_logits(adapted, tokens, positions), want, atol=ATOL, rtol=0)
  # Saved again by us, byte-identical tensors.
  again = peft_adapters.save_adapters(adapted.cfg, builder.adapter_params(adapted),
                                      tmp_path / "again")
  from safetensors.numpy import load_file
  a, b = load_file(str(tmp_path / "peft" / peft_adapters.WEIGHTS_FILE)), load_file(
      str(again / peft_adapters.WEIGHTS_FILE))
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_bf16_base_weights_under_fp32_adapters(base_dir):
  ours = hf.load_hf_model(base_dir)
  adapted = builder.with_adapters(ours, lora.LoraConfig(rank=4, alpha=8.0), _mesh(),
                                  sharding.DEFAULT_RULES, base_dtype="bfloat16")
  dtypes = {str(x.dtype) for x in jax.tree.leaves(builder.adapter_params(adapted))}
  assert dtypes == {"float32"}
  assert adapted.layers.attn.q_proj[...].dtype == jnp.bfloat16
  tokens, _, positions = _tokens()
  assert np.isfinite(_our_logits(adapted, tokens, positions)).all()


@pytest.mark.parametrize("change, message", [
    ({"use_dora": True}, "use_dora=True is not supported"),
    ({"use_rslora": True}, "use_rslora=True is not supported"),
    ({"bias": "all"}, "bias='all' is not supported"),
    ({"target_modules": "q_proj|v_proj"}, "target_modules="),
    ({"target_modules": ["q_proj", "lm_head"]}, "target_modules="),
    ({"peft_type": "IA3"}, "peft_type='IA3'"),
])
def test_unsupported_peft_options_fail_with_a_message(tmp_path, change, message):
  cfg = lora.LoraConfig(rank=2, alpha=4.0)
  config = {**peft_adapters.adapter_config(cfg), **change}
  (tmp_path / peft_adapters.CONFIG_FILE).write_text(json.dumps(config))
  (tmp_path / peft_adapters.WEIGHTS_FILE).write_bytes(b"")
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("|", r"\|")):
    peft_adapters.read_config(tmp_path)


def test_an_adapter_of_another_base_and_bad_settings_fail(base_dir, tmp_path):
  ours = hf.load_hf_model(base_dir)
  adapted = builder.with_adapters(ours, lora.LoraConfig(rank=2, alpha=4.0), _mesh(),
                                  sharding.DEFAULT_RULES)
  out = peft_adapters.save_adapters(adapted.cfg, builder.adapter_params(adapted),
                                    tmp_path / "adapter")
  import dataclasses
  wider = dataclasses.replace(ours.cfg, intermediate_size=2 * ours.cfg.intermediate_size)
  with pytest.raises(ConfigError, match="made for another base model"):
    peft_adapters.read_adapters(out, wider)
  deeper = dataclasses.replace(ours.cfg, num_layers=ours.cfg.num_layers + 1)
  with pytest.raises(ConfigError, match="made for another base model"):
    peft_adapters.read_adapters(out, deeper)
  with pytest.raises(ConfigError, match="exceeds"):
    builder.with_adapters(ours, lora.LoraConfig(rank=10_000, alpha=1.0), _mesh(),
                          sharding.DEFAULT_RULES)
  with pytest.raises(ConfigError, match="must be positive"):
    lora.LoraConfig(rank=0, alpha=1.0)
  with pytest.raises(ConfigError, match="choose a non-empty subset"):
    lora.LoraConfig(rank=2, alpha=1.0, targets=lora.parse_targets("q,lm_head"))
