"""The attribute model as a transformers *ForSequenceClassification directory.

References: transformers 5's PyTorch `LlamaForSequenceClassification`,
`Qwen3ForSequenceClassification` and `Gemma2ForSequenceClassification`
(`GenericForSequenceClassification`: a bias-free `score` layer read at the
rightmost token that is not `pad_token_id`). Reference models are tiny,
random (`torch.manual_seed`, non-trivial norms) and saved with
`save_pretrained`; nothing is downloaded. The refusal and detection tests need
no PyTorch: they read our export, or config.json as transformers writes it.
"""

import json

import jax
import numpy as np
import pytest
import torch_reference
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file
from torch_reference import needs_torch, torch

from helpsteer_jax import sharding
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import builder, hf, reward_hf
from helpsteer_jax.models.reward import reward_model

pytestmark = pytest.mark.version_tier

ATOL = 1e-4
PAD = 0
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
            initializer_range=0.2, attn_implementation="eager", pad_token_id=PAD,
            num_labels=len(ATTRIBUTES), id2label=dict(enumerate(ATTRIBUTES)),
            label2id={n: i for i, n in enumerate(ATTRIBUTES)})
ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def _hf_config(kind: str):
  if kind == "llama":
    return transformers.LlamaConfig(**TINY, rms_norm_eps=1e-5, rope_parameters=ROPE)
  if kind == "qwen3":  # q/k norms, explicit head_dim
    return transformers.Qwen3Config(**TINY, head_dim=32, rope_parameters=ROPE)
  if kind == "gemma2":  # sliding / full layers, (1 + w) norms, sandwich norms, soft-caps
    return transformers.Gemma2Config(**{**TINY, "num_hidden_layers": 3}, head_dim=32,
                                     query_pre_attn_scalar=24, sliding_window=5,
                                     attn_logit_softcapping=2.0, final_logit_softcapping=8.0,
                                     rope_parameters=ROPE)
  raise ValueError(kind)


def _reference(kind: str, tmp_path):
  """A random transformers reward model, saved; (model, directory)."""
  torch.manual_seed(0)
  model = transformers.AutoModelForSequenceClassification.from_config(_hf_config(kind)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
  out = tmp_path / f"{kind}_reference"
  model.save_pretrained(out)
  return model, out


def _batch(batch: int = 6, length: int = 16):
  """Tokens (never the pad id inside a row), mask and positions; rows of several lengths,
  right-padded with the pad id (one row left-padded, with explicit positions)."""
  rng = np.random.RandomState(1)
  tokens = rng.randint(1, 256, (batch, length))
  mask = np.ones((batch, length), np.int32)
  for b in range(1, batch):
    n = length - rng.randint(1, length // 2)
    if b == batch - 1:
      mask[b, :length - n] = 0
    else:
      mask[b, n:] = 0
  tokens = np.where(mask == 1, tokens, PAD)
  positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
  return tokens, mask, positions


def _ours(model, tokens, mask, positions) -> np.ndarray:
  return np.asarray(jax.jit(lambda t, p, s: model.score_last(t, p, s))(tokens, positions, mask))


def _tensors(directory) -> dict[str, np.ndarray]:
  out = {}
  for f in sorted(directory.glob("*.safetensors")):
    out.update(load_file(f))
  return out


@needs_torch
@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma2"])
def test_export_loads_in_transformers_with_equal_scores(kind, tmp_path):
  """transformers' `AutoModelForSequenceClassification` loads our export and its logits on a
  padded batch equal ours to 1e-4 in fp32; importing its own checkpoint gives the same
  scores (reference: transformers' *ForSequenceClassification), and import -> export
  writes the reference's tensors bit for bit."""
  reference, ref_dir = _reference(kind, tmp_path)
  ours = reward_hf.load_reward_hf(ref_dir, attention_impl="xla")
  assert not ours.head.has_bias
  tokens, mask, positions = _batch()
  ours_scores = _ours(ours, tokens, mask, positions)
  want = torch_reference.logits(reference, tokens, mask, positions)
  assert want.shape == (len(tokens), len(ATTRIBUTES)) and np.abs(want).max() > 0.5
  np.testing.assert_allclose(ours_scores, want, atol=ATOL, rtol=0)

  out = tmp_path / "export"
  reward_hf.save_reward_hf(ours, out, dtype="float32")
  raw = json.loads((out / "config.json").read_text())
  assert raw["architectures"][0].endswith("ForSequenceClassification")
  assert raw["pad_token_id"] == PAD and raw["problem_type"] == "regression"
  exported = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, dtype=torch.float32, attn_implementation="eager").eval()
  assert exported.config.num_labels == len(ATTRIBUTES)
  assert [exported.config.id2label[i] for i in range(len(ATTRIBUTES))] == list(ATTRIBUTES)
  np.testing.assert_allclose(torch_reference.logits(exported, tokens, mask, positions), ours_scores,
                             atol=ATOL, rtol=0)

  ref_tensors, out_tensors = _tensors(ref_dir), _tensors(out)
  assert set(out_tensors) == set(ref_tensors) and "score.weight" in out_tensors
  for name, value in ref_tensors.items():
    np.testing.assert_array_equal(out_tensors[name], value, err_msg=name)


def test_round_trip_is_exact(tmp_path):
  """Our model -> HF directory -> our model gives bitwise equal parameters, in bf16 as in
  fp32 storage (the bf16 values of an fp32 model read back and rewrite exactly)."""
  cfg = hf.config_from_hf(_hf_config("llama").to_dict())
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  model = reward_model(cfg, seed=3)
  model.head.kernel[...] = jax.random.normal(jax.random.key(0), model.head.kernel.shape)
  reward_hf.save_reward_hf(model, tmp_path / "a", dtype="float32")
  back = nnx.merge(*reward_hf.load_reward_state(tmp_path / "a", cfg, mesh))
  before = nnx.to_flat_state(nnx.state(model, nnx.Param))
  after = dict(nnx.to_flat_state(nnx.state(back, nnx.Param)))
  assert len(after) == len(before)
  for path, var in before:
    np.testing.assert_array_equal(np.asarray(after[path].get_value()),
                                  np.asarray(var.get_value()), err_msg=str(path))
  reward_hf.save_reward_hf(back, tmp_path / "b", dtype="bfloat16")
  again = nnx.merge(*reward_hf.load_reward_state(tmp_path / "b", cfg, mesh))
  reward_hf.save_reward_hf(again, tmp_path / "c", dtype="bfloat16")
  b, c = _tensors(tmp_path / "b"), _tensors(tmp_path / "c")
  assert set(b) == set(c)
  for name in b:
    assert b[name].tobytes() == c[name].tobytes(), name


def test_head_with_bias_is_refused(tmp_path):
  """A head trained with a bias has no transformers form (`score` is bias-free,
  transformers' GenericForSequenceClassification): export refuses it naming head_bias,
  and a directory with a `score.bias` tensor is not read with the bias dropped."""
  cfg = hf.config_from_hf(_hf_config("llama").to_dict())
  model = reward_model(cfg, head_bias=True)
  assert model.head.has_bias
  with pytest.raises(ConfigError, match="head_bias=False"):
    reward_hf.save_reward_hf(model, tmp_path / "out", dtype="float32")
  assert not (tmp_path / "out").exists()

  ref_dir = tmp_path / "bias_free"
  reward_hf.save_reward_hf(reward_model(cfg), ref_dir, dtype="float32")
  tensors = _tensors(ref_dir)
  tensors["score.bias"] = np.ones(len(ATTRIBUTES), np.float32)
  (ref_dir / "model.safetensors").unlink()
  save_file(tensors, ref_dir / "model.safetensors", metadata={"format": "pt"})
  with pytest.raises(ConfigError, match="score.bias"):
    reward_hf.load_reward_hf(ref_dir)


def _save_config(config, architecture: str, path) -> None:
  """config.json as transformers' `save_pretrained` of an `architecture` model writes it."""
  config.architectures = [architecture]
  config.save_pretrained(path)


def test_other_classifiers_are_refused(tmp_path):
  """A sequence classifier whose labels are not the nine attributes (transformers'
  default two-label head) is refused, not read into the wrong slots."""
  config = _hf_config("llama")
  config.num_labels = 2
  _save_config(config, "LlamaForSequenceClassification", tmp_path / "two")
  assert reward_hf.is_reward_dir(tmp_path / "two")
  with pytest.raises(ConfigError, match="id2label"):
    reward_hf.load_reward_hf(tmp_path / "two")


def test_detection_and_abstract_shapes(tmp_path):
  """`is_reward_dir` reads config.json `architectures`; a causal LM directory is not one."""
  _save_config(_hf_config("llama"), "LlamaForCausalLM", tmp_path / "lm")
  assert not reward_hf.is_reward_dir(tmp_path / "lm")
  assert not reward_hf.is_reward_dir(tmp_path / "missing")
  cfg = hf.config_from_hf(tmp_path / "lm")
  names = {m.hf_name for m in reward_hf.reward_mappings(cfg)}
  assert "score.weight" in names and "lm_head.weight" not in names
  _, abstract = builder.abstract_module(lambda: reward_model(cfg))
  assert "lm_head" not in nnx.to_pure_dict(abstract)["backbone"]
