"""HF checkpoint import / export against transformers' PyTorch models.

Every reference model is a tiny random transformers model (`torch.manual_seed`,
random weights, non-trivial norms and biases) saved with `save_pretrained`;
nothing is downloaded. The tests of error messages, tokenizer files and the
safetensors writer need no PyTorch and run on a checkpoint of our own export.
"""

import copy
import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest
import torch_reference
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file
from torch_reference import needs_torch, torch

from helpsteer_jax import sharding
from helpsteer_jax.models import builder, hf
from helpsteer_jax.models import safetensors_io as st
from helpsteer_jax.models.config import RopeScaling
from helpsteer_jax.models.rope import inverse_frequencies

pytestmark = pytest.mark.version_tier

P = jax.sharding.PartitionSpec
ATOL = 1e-4
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            max_position_embeddings=128, initializer_range=0.2,
            attn_implementation="eager")


def _hf_config(kind: str):
  if kind == "llama2":
    return transformers.LlamaConfig(
        **TINY, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
  if kind == "llama31":
    return transformers.LlamaConfig(
        **TINY, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=[2, 3],
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                         "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 16})
  if kind == "llama32":  # Llama 3.2: tied, llama3 RoPE scaled by 32
    return transformers.LlamaConfig(
        **TINY, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 16})
  if kind == "mistral":  # head_dim * heads != hidden_size; a window shorter than rows
    return transformers.MistralConfig(**TINY, head_dim=32, sliding_window=5,
                                      rope_parameters={"rope_type": "default",
                                                       "rope_theta": 10000.0})
  if kind == "qwen3":  # q/k norms, explicit head_dim, no biases
    return transformers.Qwen3Config(**TINY, head_dim=32, rms_norm_eps=1e-6,
                                    rope_parameters={"rope_type": "default",
                                                     "rope_theta": 1e6})
  if kind == "gemma2":  # 3 layers: sliding, full, sliding (window 5); small soft-caps
    return transformers.Gemma2Config(**{**TINY, "num_hidden_layers": 3}, head_dim=32,
                                     query_pre_attn_scalar=24, sliding_window=5,
                                     attn_logit_softcapping=2.0, final_logit_softcapping=8.0,
                                     rope_parameters={"rope_type": "default",
                                                      "rope_theta": 10000.0})
  if kind == "qwen2":
    return transformers.Qwen2Config(**TINY, tie_word_embeddings=True,
                                    rms_norm_eps=1e-6, eos_token_id=5,
                                    rope_parameters={"rope_type": "default",
                                                     "rope_theta": 1e6})
  raise ValueError(kind)


def _make_hf_model(kind: str, seed: int = 0):
  torch.manual_seed(seed)
  cfg = _hf_config(kind)
  model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.5 * torch.randn_like(p))
  return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """kind -> (HF model, single-file dir, sharded dir)."""
  out = {}
  for kind in ("llama2", "llama31", "llama32", "mistral", "qwen2", "qwen3", "gemma2"):
    model = _make_hf_model(kind)
    single = tmp_path_factory.mktemp(f"{kind}_single")
    sharded = tmp_path_factory.mktemp(f"{kind}_sharded")
    model.save_pretrained(single)
    model.save_pretrained(sharded, max_shard_size="40KB")
    assert (sharded / st.INDEX_FILE).exists()
    out[kind] = (model, str(single), str(sharded))
  # Llama 2 / TinyLlama checkpoints predate rope_parameters: v4-style config.
  path = os.path.join(out["llama2"][1], "config.json")
  with open(path) as f:
    raw = json.load(f)
  raw["rope_theta"] = raw.pop("rope_parameters")["rope_theta"]
  raw["rope_scaling"] = None
  raw["torch_dtype"] = raw.pop("dtype")
  with open(path, "w") as f:
    json.dump(raw, f)
  return out


@pytest.fixture(scope="module")
def llama2_dir(tmp_path_factory) -> str:
  """A random model of the llama2 shape written by our HF export (no PyTorch needed)."""
  out = tmp_path_factory.mktemp("llama2_ours")
  model = builder.create(hf.config_from_hf(_hf_config("llama2").to_dict()), seed=0)
  hf.save_hf_model(model, out, dtype="float32")
  return str(out)


def _batch(batch: int = 8, length: int = 16, vocab: int = 256):
  """Tokens, mask, positions: rows alternate right- and left-padding."""
  rng = np.random.RandomState(1)
  tokens = rng.randint(3, vocab, (batch, length))
  mask = np.ones((batch, length), np.int32)
  for b in range(1, batch):
    pad = rng.randint(1, length // 2)
    if b % 2:
      mask[b, length - pad:] = 0  # right padding
    else:
      mask[b, :pad] = 0  # left padding
  tokens = np.where(mask == 1, tokens, 0)
  positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
  return tokens, mask, positions


def _our_logits(model, tokens, mask, positions, mesh=None) -> np.ndarray:
  fn = jax.jit(lambda t, p, s: model.logits(model(t, positions=p, segment_ids=s)))
  if mesh is None:
    return np.asarray(fn(tokens, positions, mask))
  with jax.set_mesh(mesh), sharding.axis_rules(sharding.DEFAULT_RULES):
    return np.asarray(fn(tokens, positions, mask))


def _assert_parity(ours, ref, mask, atol=ATOL):
  real = mask.astype(bool)
  diff = np.abs(ours[real] - ref[real]).max()
  assert np.abs(ref[real]).max() > 1.0  # logits are not trivially small
  assert diff <= atol, f"max abs logit diff {diff}"


def _check_import(checkpoints, kind, which=1, mesh=None, **overrides):
  hf_model = checkpoints[kind][0]
  ours = hf.load_hf_model(checkpoints[kind][which], mesh, **overrides)
  tokens, mask, positions = _batch()
  _assert_parity(_our_logits(ours, tokens, mask, positions, mesh),
                 torch_reference.logits(hf_model, tokens, mask, positions), mask)
  return ours


@needs_torch
def test_llama2_parity(checkpoints):
  """Matches transformers 5 `LlamaForCausalLM` (Llama 2 / TinyLlama style,
  v4-style `rope_theta` config, GQA 4 heads / 2 kv heads, padded batch)."""
  ours = _check_import(checkpoints, "llama2")
  assert ours.cfg.rope_scaling is None and ours.cfg.rope_theta == 10000.0
  assert ours.cfg.hf_architecture == "LlamaForCausalLM"


@needs_torch
def test_llama31_parity_sharded_index(checkpoints):
  """Matches transformers 5 `LlamaForCausalLM` with `rope_type='llama3'`
  (Llama 3.1), read from a sharded `model.safetensors.index.json`."""
  ours = _check_import(checkpoints, "llama31", which=2)
  cfg = ours.cfg
  assert cfg.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 16)
  assert cfg.eos_token_id == (2, 3)
  unscaled = inverse_frequencies(cfg.replace(rope_scaling=None))
  assert not np.allclose(inverse_frequencies(cfg), unscaled)


@needs_torch
def test_mistral_parity(checkpoints):
  """Matches transformers 5 `MistralForCausalLM` (explicit head_dim=32 with
  hidden 64 / 4 heads; a sliding window of 5 on rows of up to 16 tokens)."""
  ours = _check_import(checkpoints, "mistral")
  assert ours.cfg.head_dim == 32 and ours.cfg.sliding_window == 5
  assert ours.cfg.layer_windows() == (5, 5)
  assert ours.layers.attn.q_proj[...].shape == (2, 64, 4, 32)


@needs_torch
def test_qwen2_parity(checkpoints):
  """Matches transformers 5 `Qwen2ForCausalLM` (random q/k/v biases, tied
  embeddings)."""
  ours = _check_import(checkpoints, "qwen2", which=2)
  assert ours.cfg.attention_bias and ours.cfg.tie_word_embeddings
  assert not hasattr(ours, "lm_head")
  assert np.abs(np.asarray(ours.layers.attn.q_bias[...])).max() > 0.1


# What each family's import must have set, besides matching the logits.
FAMILY_TRAITS = {
    "llama32": dict(tie_word_embeddings=True, hf_model_type="llama"),
    "qwen3": dict(qk_norm=True, attention_bias=False, head_dim=32, hf_model_type="qwen3"),
    "gemma2": dict(sandwich_norms=True, norm_unit_offset=True, scale_embeddings=True,
                   mlp_activation="gelu_tanh", query_pre_attn_scalar=24,
                   attn_logit_softcap=2.0, final_logit_softcap=8.0, sliding_window=5,
                   layer_types=("sliding_attention", "full_attention"),
                   tie_word_embeddings=True, hf_model_type="gemma2"),
}


@needs_torch
@pytest.mark.parametrize("kind", sorted(FAMILY_TRAITS))
def test_family_parity(checkpoints, kind):
  """Matches transformers 5 `Qwen3ForCausalLM` / `Gemma2ForCausalLM` /
  `LlamaForCausalLM` (Llama 3.2) on the padded batch (rows of up to 16
  tokens: Gemma 2's window of 5 and soft-caps at work)."""
  ours = _check_import(checkpoints, kind)
  for name, value in FAMILY_TRAITS[kind].items():
    assert getattr(ours.cfg, name) == value, name


@needs_torch
@pytest.mark.parametrize("kind,mesh_shape,impl", [
    ("llama31", (2, 2, 2), "xla"),
    ("qwen2", (1, 8, 1), "blockwise"),
    ("mistral", (2, 2, 2), "blockwise"),
    ("llama2", (1, 8, 1), "xla"),
    ("qwen3", (2, 2, 2), "blockwise"),
    ("gemma2", (2, 2, 2), "blockwise"),
    ("llama32", (1, 8, 1), "xla"),
])
def test_mesh_parity(checkpoints, kind, mesh_shape, impl):
  """Matches the transformers 5 model of `kind` on the 8-device CPU mesh,
  with every parameter sharded per DEFAULT_RULES."""
  mesh = sharding.make_mesh(mesh_shape)
  ours = _check_import(checkpoints, kind, which=2 if kind == "llama31" else 1,
                       mesh=mesh, attention_impl=impl, attention_block_size=8)
  assert ours.layers.attn.q_proj[...].sharding.spec == P(None, "fsdp", "tensor", None)
  assert ours.layers.mlp.down_proj[...].sharding.spec == P(None, "tensor", "fsdp")
  assert ours.embed[...].sharding.spec == P("tensor", "fsdp")
  if not ours.cfg.tie_word_embeddings:
    assert ours.lm_head[...].sharding.spec == P("fsdp", "tensor")
  if ours.cfg.attention_bias:
    assert ours.layers.attn.k_bias[...].sharding.spec == P(None, "tensor", None)
  _, abstract = builder.abstract_model(ours.cfg)
  specs = dict(_flat(builder.state_specs(abstract, sharding.DEFAULT_RULES)))
  for path, value in _flat(nnx.state(ours)):
    assert value.sharding.mesh == mesh
    assert value.sharding.spec == specs[path], path


@needs_torch
@pytest.mark.parametrize("kind", ["mistral", "gemma2"])
def test_packed_rows_match_separate_sequences(checkpoints, kind):
  """A row packing sequences of 9 and 7 tokens (segment ids, positions
  restarting; window 5) gives, per segment, transformers' logits of that
  sequence run alone."""
  hf_model = checkpoints[kind][0]
  ours = hf.load_hf_model(checkpoints[kind][1], attention_impl="blockwise",
                          attention_block_size=4)
  rng = np.random.RandomState(2)
  first, second = rng.randint(3, 256, 9), rng.randint(3, 256, 7)
  tokens = np.concatenate([first, second])[None]
  segments = np.array([[1] * 9 + [2] * 7])
  positions = np.concatenate([np.arange(9), np.arange(7)])[None]
  packed = _our_logits(ours, tokens, segments, positions)[0]
  for seq, rows in ((first, slice(0, 9)), (second, slice(9, 16))):
    ones = np.ones((1, len(seq)), np.int64)
    alone = torch_reference.logits(hf_model, seq[None], ones, np.arange(len(seq))[None])[0]
    _assert_parity(packed[rows], alone, ones[0])


def _flat(state):
  return [(path, v.get_value()) for path, v in nnx.to_flat_state(state)]


@needs_torch
@pytest.mark.parametrize("kind", ["llama31", "qwen2", "mistral", "qwen3", "gemma2"])
def test_round_trip(checkpoints, kind, tmp_path):
  """Import on a (2,2,2) mesh -> export -> transformers 5
  `AutoModelForCausalLM.from_pretrained` gives the original HF logits."""
  hf_model, single, _ = checkpoints[kind]
  mesh = sharding.make_mesh((2, 2, 2))
  ours = hf.load_hf_model(single, mesh)
  tokens, mask, positions = _batch()
  ref = torch_reference.logits(hf_model, tokens, mask, positions)
  hf_names = set(st.SafetensorsFile(os.path.join(single, "model.safetensors")).keys())

  for name, max_bytes in (("fp32", 5 * 2**30), ("fp32_sharded", 60_000)):
    out = tmp_path / name
    files = hf.save_hf_model(ours, out, dtype="float32", max_shard_bytes=max_bytes)
    assert (len(files) > 1) == (name == "fp32_sharded")
    assert (out / st.INDEX_FILE).exists() == (len(files) > 1)
    reader = st.CheckpointReader(out)
    assert set(reader.names()) == hf_names  # tied: no lm_head.weight
    for f in files:  # a file exceeds the limit only to hold one big tensor
      infos = st.SafetensorsFile(out / f).tensors.values()
      assert sum(i.nbytes for i in infos) <= max_bytes or len(infos) == 1
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation="eager").eval()
    want, got = hf_model.config.to_dict(), loaded.config.to_dict()
    assert {k: (want.get(k), got.get(k)) for k in set(want) | set(got)
            if want.get(k) != got.get(k) and k != "_name_or_path"} == {}
    _assert_parity(torch_reference.logits(loaded, tokens, mask, positions), ref, mask)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == hf_model.config.eos_token_id
  reader = st.CheckpointReader(tmp_path / "fp32_sharded")
  index = json.loads((tmp_path / "fp32_sharded" / st.INDEX_FILE).read_text())
  assert index["metadata"]["total_size"] == sum(reader.info(n).nbytes for n in reader.names())

  out = tmp_path / "bf16"
  hf.save_hf_model(ours, out)  # default bfloat16
  assert st.SafetensorsFile(out / "model.safetensors").tensors[
      "model.norm.weight"].dtype == np.dtype("bfloat16")
  loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
  assert loaded.dtype == torch.bfloat16
  loaded32 = transformers.AutoModelForCausalLM.from_pretrained(
      out, dtype=torch.float32, attn_implementation="eager").eval()
  got = torch_reference.logits(loaded32, tokens, mask, positions)
  real = mask.astype(bool)
  assert np.abs(got[real] - ref[real]).max() < 0.05 * np.abs(ref[real]).max()


@needs_torch
@pytest.mark.parametrize("torch_dtype", ["bfloat16", "float16"])
def test_half_precision_checkpoint(checkpoints, tmp_path, torch_dtype):
  """Reads bf16 / fp16 safetensors exactly: matches transformers 5
  `LlamaForCausalLM` with the same half-precision weights run in fp32."""
  dtype = getattr(torch, torch_dtype)
  model = _make_hf_model("llama2")
  with torch.no_grad():  # round the weights only (not the rotary buffers)
    for p in model.parameters():
      p.copy_(p.to(dtype).float())
  copy.deepcopy(model).to(dtype).save_pretrained(tmp_path)
  assert st.SafetensorsFile(tmp_path / "model.safetensors").tensors[
      "model.embed_tokens.weight"].dtype.itemsize == 2
  ours = hf.load_hf_model(tmp_path)
  assert ours.embed[...].dtype == np.float32
  tokens, mask, positions = _batch()
  _assert_parity(_our_logits(ours, tokens, mask, positions),
                 torch_reference.logits(model, tokens, mask, positions), mask)
  ours16 = hf.load_hf_model(tmp_path, param_dtype="bfloat16")
  assert ours16.layers.attn.q_proj[...].dtype == jax.numpy.bfloat16


def _rewrite(src, dst, edit):
  shutil.copytree(src, dst)
  path = os.path.join(dst, "model.safetensors")
  tensors = load_file(path)
  edit(tensors)
  save_file(tensors, path, metadata={"format": "pt"})
  return path


def test_missing_wrong_shape_and_extra_tensors(llama2_dir, tmp_path, caplog):
  """A missing or mis-shaped tensor is named with its file; extra tensors
  (e.g. old rotary inv_freq buffers) are ignored with a warning."""
  src = llama2_dir
  name = "model.layers.1.mlp.down_proj.weight"
  path = _rewrite(src, tmp_path / "missing", lambda t: t.pop(name))
  with pytest.raises(hf.CheckpointError, match=name) as err:
    hf.load_hf_model(tmp_path / "missing")
  assert path in str(err.value)

  def transpose(t):
    t[name] = np.ascontiguousarray(t[name].T)
  path = _rewrite(src, tmp_path / "shape", transpose)
  with pytest.raises(hf.CheckpointError, match=r"shape \(128, 64\)") as err:
    hf.load_hf_model(tmp_path / "shape")
  assert name in str(err.value) and path in str(err.value)

  extra = "model.layers.0.self_attn.rotary_emb.inv_freq"
  _rewrite(src, tmp_path / "extra", lambda t: t.update({extra: np.ones(8, np.float32)}))
  with caplog.at_level(logging.WARNING, logger=hf.__name__):
    hf.load_hf_model(tmp_path / "extra")
  assert extra in caplog.text


def _tiny_tokenizer(directory):
  from tokenizers import Tokenizer, models, pre_tokenizers
  vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
  fast.save_pretrained(directory)
  return fast


def test_tokenizer_files(llama2_dir, tmp_path):
  """Exported directories are usable by transformers 5 `AutoTokenizer`."""
  src = tmp_path / "tok"
  fast = _tiny_tokenizer(src)
  with pytest.raises(FileNotFoundError, match="No tokenizer files"):
    hf.load_tokenizer(llama2_dir)
  ours = hf.load_hf_model(llama2_dir)
  out = tmp_path / "export"
  hf.save_hf_model(ours, out, tokenizer=src)
  loaded = hf.load_tokenizer(out)
  assert loaded("hello world")["input_ids"] == fast("hello world")["input_ids"]
  copied = hf.copy_tokenizer_files(src, tmp_path / "copy")
  assert "tokenizer.json" in copied
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="No tokenizer files"):
    hf.copy_tokenizer_files(tmp_path / "empty", tmp_path / "none")


@pytest.mark.parametrize("framework", ["flax", pytest.param("pt", marks=needs_torch)])
def test_safetensors_writer_is_readable_by_safetensors(tmp_path, framework):
  """Files we stream are valid for the reference `safetensors` library (read as JAX
  arrays, and as PyTorch tensors)."""
  import ml_dtypes
  from safetensors import safe_open
  arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
            "b": np.arange(5).astype(ml_dtypes.bfloat16),
            "c": np.ones((3, 1, 2), np.float16)}
  plans = [st.TensorPlan(k, v.shape, v.dtype) for k, v in arrays.items()]
  st.write_file(tmp_path / "x.safetensors", plans, lambda p: arrays[p.name])
  as_fp32 = {"flax": lambda t: np.asarray(t, np.float32),
             "pt": lambda t: t.float().numpy()}[framework]
  with safe_open(tmp_path / "x.safetensors", framework=framework) as f:
    assert f.metadata() == {"format": "pt"}
    for k, v in arrays.items():
      np.testing.assert_array_equal(as_fp32(f.get_tensor(k)), v.astype(np.float32))
  ours = st.SafetensorsFile(tmp_path / "x.safetensors")
  for k, v in arrays.items():
    np.testing.assert_array_equal(ours.get(k), v)
  assert [len(s) for s in st.plan_shards(plans, 24)] == [1, 2]
