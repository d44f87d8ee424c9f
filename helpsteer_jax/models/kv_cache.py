"""The preallocated key/value cache of autoregressive decoding.

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

from helpsteer_jax.models.config import ModelConfig
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
