"""KV-cache decoding against transformers' PyTorch `generate` and against full
recomputation; tensor-parallel decoding; one compile per bucket.

The reference models are tiny random transformers Llama, Mistral (window 8),
Qwen3 and Gemma 2 (window 8 on alternate layers) models (`torch.manual_seed`,
nothing downloaded), imported with our HF loader so both run the same
weights; prompts of up to 12 tokens and 32 new tokens decode past the window.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx
from torch_reference import needs_torch, torch

from helpsteer_jax import sharding
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import decode
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.models import builder, catalog, families, hf, kv_cache
from helpsteer_jax.models.kv_cache import KVCache

PROMPTS = [[1, 17, 99, 4, 250, 33, 7], [1, 5], [1, 200, 201, 202, 9, 8, 7, 6, 5, 4, 3, 120]]


def _one_device():
  return sharding.make_mesh((1, 1, 1), jax.devices()[:1])


_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
             max_position_embeddings=128, initializer_range=0.1, bos_token_id=1,
             eos_token_id=2, pad_token_id=0, attn_implementation="eager")
_HF_CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**_TINY),
    "mistral": lambda: transformers.MistralConfig(**_TINY, sliding_window=8),
    "qwen3": lambda: transformers.Qwen3Config(**_TINY, head_dim=16),
    "gemma2": lambda: transformers.Gemma2Config(
        **{**_TINY, "num_hidden_layers": 3}, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=10.0),
}


def _hf_pair(kind, path):
  """A random transformers model of `kind`, saved to `path`."""
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(_HF_CONFIGS[kind]()).eval()
  model.save_pretrained(path)
  return model, path


@needs_torch
@pytest.mark.parametrize("kind", sorted(_HF_CONFIGS))
def test_greedy_matches_transformers_generate(kind, tmp_path):
  """Batched prompts of lengths 7, 2 and 12, left-padded by both frameworks."""
  pt_model, path = _hf_pair(kind, tmp_path)
  ours = hf.load_hf_model(path, attention_impl="blockwise", attention_block_size=8)
  sampler = decode.Sampler(ours, _one_device(), max_length=128)
  result = sampler.generate(PROMPTS, max_new_tokens=32,
                            stop=decode.StopTokens(ids=(2,)))

  longest = max(map(len, PROMPTS))
  ids = torch.zeros((len(PROMPTS), longest), dtype=torch.long)
  mask = torch.zeros_like(ids)
  for i, p in enumerate(PROMPTS):
    ids[i, longest - len(p):] = torch.tensor(p)
    mask[i, longest - len(p):] = 1
  with torch.inference_mode():
    ref = pt_model.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False,
                            eos_token_id=2, pad_token_id=0)[:, longest:].numpy()
  assert ref.shape == (3, 32)
  np.testing.assert_array_equal(result.tokens, ref)
  # The comparison is only meaningful if the text is not one repeated token.
  assert len(set(result.tokens[0].tolist())) > 3


def _cached_vs_full(model, prompts, steps):
  """Greedy decoding through prefill/decode_step, then one full forward."""
  graphdef, state = nnx.split(model)
  batch, plen = len(prompts), max(map(len, prompts))
  tokens = np.zeros((batch, plen), np.int32)
  lengths = np.array([len(p) for p in prompts], np.int32)
  for i, p in enumerate(prompts):
    tokens[i, plen - len(p):] = p
  pad = plen - lengths
  idx = np.arange(plen)[None]
  seg = (idx >= pad[:, None]).astype(np.int32)
  pos = np.maximum(idx - pad[:, None], 0).astype(np.int32)

  @jax.jit
  def prefill(state, tokens, pos, seg):
    m = nnx.merge(graphdef, state)
    h, cache = kv_cache.prefill(m, tokens, pos, seg, KVCache.init(m.cfg, batch, plen + steps))
    return m.logits(h[:, -1:])[:, 0], cache

  @jax.jit
  def step(state, token, pos, cache):
    m = nnx.merge(graphdef, state)
    h, cache = kv_cache.decode_step(m, token[:, None], pos[:, None], cache)
    return m.logits(h)[:, 0], cache

  logits, cache = prefill(state, tokens, pos, seg)
  cached = [np.asarray(logits)]
  generated = []
  for s in range(steps):
    token = jnp.argmax(logits, -1).astype(jnp.int32)
    generated.append(np.asarray(token))
    if s == steps - 1:
      break
    logits, cache = step(state, token, jnp.asarray(lengths + s), cache)
    cached.append(np.asarray(logits))

  full_tokens = np.concatenate([tokens, np.stack(generated, 1)], 1)
  full_seg = np.concatenate([seg, np.ones((batch, steps), np.int32)], 1)
  full_pos = np.concatenate([pos, lengths[:, None] + np.arange(steps)[None]], 1)

  @jax.jit
  def full(state, t, p, s):
    m = nnx.merge(graphdef, state)
    return m.logits(m(t, p, s))

  ref = np.asarray(full(state, full_tokens, full_pos, full_seg))
  return np.stack(cached, 1), ref[:, plen - 1: plen - 1 + steps]


# Gemma 2's knobs with a window of 4: ten decode steps run past it.
_GEMMA2 = dict(families.get("gemma2").config_fields(), num_layers=3, sliding_window=4,
               layer_types=("sliding_attention", "full_attention"), attn_logit_softcap=5.0,
               final_logit_softcap=10.0, query_pre_attn_scalar=16, tie_word_embeddings=True)


@pytest.mark.parametrize("impl,scan,family", [
    ("xla", True, {}), ("blockwise", True, {}), ("xla", False, {}),
    ("blockwise", True, _GEMMA2)], ids=["xla", "blockwise", "unscanned", "gemma2"])
def test_cached_logits_equal_full_recompute(impl, scan, family):
  cfg = catalog.model_config("tiny", **family, attention_impl=impl, attention_block_size=4,
                             initializer_range=0.1, scan_layers=scan)
  model = builder.create(cfg, seed=3)
  cached, full = _cached_vs_full(model, PROMPTS, steps=10)
  np.testing.assert_allclose(cached, full, atol=1e-4, rtol=0)


def test_tensor_parallel_decode_matches_one_device():
  cfg = catalog.model_config("tiny", num_heads=8, num_kv_heads=4, head_dim=16,
                             initializer_range=0.1)
  single = builder.create(cfg, seed=1)
  mesh = sharding.make_mesh((2, 1, 4))  # 8 devices: 2-way data, 4-way tensor
  sharded = builder.init_model(cfg, mesh, sharding.DEFAULT_RULES, seed=1)
  q_spec = nnx.state(sharded)["layers"]["attn"]["q_proj"][...].sharding.spec
  assert "tensor" in tuple(q_spec)
  args = dict(max_new_tokens=12, stop=decode.StopTokens())
  ref = decode.Sampler(single, _one_device(), max_length=64).generate(PROMPTS, **args)
  dec = decode.Sampler(sharded, mesh, max_length=64)
  out = dec.generate(PROMPTS, **args)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert dec.buckets(3, 12, 12) == (4, 16)  # batch rounded to the 2 batch shards


def test_one_compile_per_bucket_and_eos_ends_rows():
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  dec = decode.Sampler(model, _one_device(), max_length=64)
  first = dec.generate(PROMPTS, max_new_tokens=8)
  dec.generate([[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]], max_new_tokens=8)
  assert dec.compiled_variants == 1
  # Use the token the first row produces at step 3 as its "EOS".
  eos = int(first.tokens[0, 3])
  stopped = dec.generate(PROMPTS, max_new_tokens=8, stop=decode.StopTokens(ids=(eos,)))
  assert stopped.stopped[0]
  n = stopped.lengths[0]
  assert n <= 4 and stopped.tokens[0, n - 1] == eos
  assert (stopped.tokens[0, n:] == 0).all()
  np.testing.assert_array_equal(stopped.tokens[0, :n], first.tokens[0, :n])
  # A two-token stop sequence ends a row when both appear in order.
  seq = tuple(int(t) for t in first.tokens[1, 2:4])
  by_seq = dec.generate(PROMPTS, max_new_tokens=8, stop=decode.StopTokens(sequences=(seq,)))
  assert by_seq.stopped[1] and by_seq.lengths[1] <= 4
  assert tuple(by_seq.tokens[1, by_seq.lengths[1] - 2: by_seq.lengths[1]]) == seq


def test_sampling_is_reproducible_with_a_seed():
  model = builder.create(catalog.model_config("tiny", initializer_range=0.05), seed=0)
  dec = decode.Sampler(model, _one_device(), max_length=64)
  hot = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95)
  a = dec.generate(PROMPTS, max_new_tokens=16, sampling=hot, seed=7)
  b = dec.generate(PROMPTS, max_new_tokens=16, sampling=hot, seed=7)
  c = dec.generate(PROMPTS, max_new_tokens=16, sampling=hot, seed=8)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert (a.tokens != c.tokens).any()


def test_bad_prompts_raise_clear_errors():
  model = builder.create(catalog.model_config("tiny"), seed=0)
  dec = decode.Sampler(model, _one_device(), max_length=32)
  with pytest.raises(ConfigError, match="prompt 1 is empty"):
    dec.generate([[1, 2], []], max_new_tokens=4)
  with pytest.raises(ConfigError, match="exceeds the KV cache length 32"):
    dec.generate([[1] * 30], max_new_tokens=4)
  with pytest.raises(ConfigError, match="max_new_tokens"):
    dec.generate([[1]], max_new_tokens=0)
