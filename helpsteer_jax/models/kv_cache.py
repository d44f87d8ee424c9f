"""Autoregressive decoding's key/value cache and the decoder's forward through it.

`prefill` runs prompts into an empty cache and `decode_step` appends tokens
to it; both reuse the `Decoder`'s embedding, layer scan and attention
projections, so only decoding loads this module.

One buffer per keys and values, stacked over layers like the parameters:
[layers, batch, kv_heads, length, head_dim]. Heads come before positions so
that a decode step's attention reads each (batch, head)'s keys and values as
one contiguous [length, head_dim] matrix: with positions first, XLA
transposed the whole cached layer at every step (a quarter of the decode
time at batch 16). Every row writes the same slot at each step (prompts are
left-padded to one length), so a write is a single
`dynamic_update_slice` into the loop-carried buffer, done in place.
`segment_ids` marks filled slots (1) against empty and padding slots (0);
the attention mask reads it exactly as it reads training segment ids.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from helpsteer_jax.models import attention as attention_lib
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.decoder import Decoder
from helpsteer_jax.models.layers import Attention, DecoderLayer
from helpsteer_jax.models.rope import rope_tables
from helpsteer_jax.sharding import constrain

CACHE_AXES = ("layers", "batch", "kv_heads", "length", "head_dim")


@dataclasses.dataclass
class KVCache:
  """Cached keys and values; `end` is the number of slots written so far."""

  k: jax.Array
  v: jax.Array
  segment_ids: jax.Array
  end: jax.Array

  @classmethod
  def init(cls, cfg: ModelConfig, batch: int, length: int) -> "KVCache":
    """An empty cache in the compute dtype, laid out by the active rules."""
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, length, cfg.head_dim)
    zeros = constrain(jnp.zeros(shape, cfg.compute_dtype), CACHE_AXES)
    return cls(k=zeros, v=zeros,
               segment_ids=constrain(jnp.zeros((batch, length), jnp.int32),
                                     ("batch", "length")),
               end=jnp.zeros((), jnp.int32))

  @property
  def length(self) -> int:
    return self.k.shape[3]


jax.tree_util.register_dataclass(
    KVCache, data_fields=["k", "v", "segment_ids", "end"], meta_fields=[])


def write(buffer: jax.Array, layer: jax.Array | int, start: jax.Array,
          new: jax.Array) -> jax.Array:
  """Writes `new` [batch, T, kv_heads, head_dim] at (layer, :, :, start)."""
  zero = jnp.zeros((), jnp.int32)
  index = (jnp.asarray(layer, jnp.int32), zero, zero, jnp.asarray(start, jnp.int32), zero)
  heads_first = new.transpose(0, 2, 1, 3)[None].astype(buffer.dtype)
  return constrain(jax.lax.dynamic_update_slice(buffer, heads_first, index), CACHE_AXES)


def read(buffer: jax.Array, layer: jax.Array | int) -> jax.Array:
  """One layer's [batch, kv_heads, length, head_dim] slice."""
  out = jax.lax.dynamic_index_in_dim(buffer, jnp.asarray(layer, jnp.int32), 0, keepdims=False)
  return constrain(out, CACHE_AXES[1:])


def prefill(model: Decoder, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array,
            cache: KVCache) -> tuple[jax.Array, KVCache]:
  """Runs prompts [B, T] into an empty cache; returns hidden states and the cache.

  Padding tokens carry segment id 0 (left padding: every row's last prompt
  token is then at T-1). The prompt attends with the training kernels.
  """
  return _run_cached(model, tokens, positions, segment_ids, cache, prefill=True)


def decode_step(model: Decoder, tokens: jax.Array, positions: jax.Array,
                cache: KVCache) -> tuple[jax.Array, KVCache]:
  """Appends tokens [B, T] (usually T = 1) at the cache's end and attends over it."""
  return _run_cached(model, tokens, positions, jnp.ones_like(tokens), cache, prefill=False)


def _run_cached(model: Decoder, tokens, positions, segment_ids, cache: KVCache,
                prefill: bool) -> tuple[jax.Array, KVCache]:
  start = cache.end
  segment_ids = segment_ids.astype(jnp.int32)
  filled = jax.lax.dynamic_update_slice(cache.segment_ids, segment_ids, (0, start))
  # A prefill sees only its own tokens; a decode step sees every filled slot
  # (slot indices are positions shifted by the row's left padding, so a
  # sliding window over slots is the window over positions).
  info = (attention_lib.MaskInfo(segment_ids, segment_ids, 0) if prefill
          else attention_lib.MaskInfo(segment_ids, filled, start))
  cos, sin = rope_tables(positions, model.cfg)

  # The whole cache rides in the carry and each layer writes its slice in
  # place (passing layer slices as scan inputs/outputs copies the cache).
  def step(carry, layer, index, window):
    x, kv = carry
    return _layer_with_cache(layer, x, cos, sin, info, kv, index, start, prefill, window)

  x, (k, v) = model.over_layers(step, (model.embed_tokens(tokens), (cache.k, cache.v)))
  cache = KVCache(k=k, v=v, segment_ids=filled, end=start + tokens.shape[1])
  with jax.named_scope("final_norm"):
    return model.final_norm(x), cache


def _layer_with_cache(layer: DecoderLayer, x, cos, sin, info, kv, index, start,
                      prefill: bool, window: int | None):
  with jax.named_scope("input_norm"):
    h = layer.input_norm(x)
  with jax.named_scope("attention"):
    h, kv = _attention_with_cache(layer.attn, h, cos, sin, info, kv, index, start, prefill,
                                  window)
  return layer.add_mlp(x, h), kv


def _attention_with_cache(attn: Attention, x, cos, sin, info: attention_lib.MaskInfo, kv,
                          layer, start, prefill: bool, window: int | None):
  """Attention that also writes this call's keys and values into the cache.

  `kv` is the (keys, values) pair of stacked cache buffers. A prefill (into
  an empty cache) attends over its own tokens with the configured kernel;
  a decode step attends over the cached layer (`cached_attention`).
  """
  q, k, v = attn.project_qkv(x, cos, sin)
  kv = (write(kv[0], layer, start, k), write(kv[1], layer, start, v))
  if prefill:
    out = attn.attend(q, k, v, info, window)
  else:
    out = attention_lib.cached_attention(q, read(kv[0], layer), read(kv[1], layer), info,
                                         **attn.knobs(window))
  return attn.output(out), kv
