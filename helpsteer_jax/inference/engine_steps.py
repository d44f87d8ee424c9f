"""The engine's compiled functions over its batched KV cache [layers, rows, kv_heads, slots, dim].

Every row writes the same slot at each step (`end`, shared), so a decode step
is one `dynamic_update_slice`; a row's tokens occupy `[row_start, end)` and
its RoPE positions count from its own first token. `prefill_row` fills one
row, `decode_chunk` advances all rows by a fixed number of steps, and
`roll_rows` moves every row's slots (the engine's re-base). Each takes the
model as (graphdef, state) so that its shapes, not its weights, key the compile.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.inference import sampling as sampling_lib
from helpsteer_jax.inference.decode import MIN_PROMPT_BUCKET
from helpsteer_jax.models import kv_cache
from helpsteer_jax.models.kv_cache import KVCache


def prompt_buckets(max_length: int) -> list[int]:
  """Prompt lengths compiled for prefill: powers of two from 16, then `max_length`."""
  out, n = [], MIN_PROMPT_BUCKET
  while n < max_length:
    out.append(n)
    n *= 2
  return out + [max_length]


def prefill_row(state, k, v, tokens, length, row, end, temperature, top_p, seed, *, graphdef,
                rules):
  """Prefills one left-padded prompt [1, T] and writes it into `row`, ending at `end`;
  returns the cache and the first sampled token."""
  with sharding_lib.axis_rules(rules):
    model = nnx.merge(graphdef, state)
    t = tokens.shape[1]
    index = jnp.arange(t, dtype=jnp.int32)[None]
    pad = t - length
    segment_ids = (index >= pad).astype(jnp.int32)
    positions = jnp.maximum(index - pad, 0)
    small = KVCache.init(model.cfg, 1, t)
    hidden, small = kv_cache.prefill(model, tokens, positions, segment_ids, small)
    first = sampling_lib.sample_rows(model.logits(hidden[:, -1:])[:, 0],
                                     jax.random.fold_in(jax.random.key(seed), 0)[None],
                                     temperature[None],
                                     top_p[None])
    zero = jnp.zeros((), jnp.int32)
    at = (zero, row, zero, end - t, zero)
    k = jax.lax.dynamic_update_slice(k, small.k.astype(k.dtype), at)
    v = jax.lax.dynamic_update_slice(v, small.v.astype(v.dtype), at)
    return k, v, first[0]


def row_buckets(max_batch: int) -> list[int]:
  """Row counts compiled for decode: powers of two below `max_batch`, then `max_batch`."""
  out, n = [], 1
  while n < max_batch:
    out.append(n)
    n *= 2
  return out + [max_batch]


def decode_chunk(state, k, v, end, row_start, last, positions, temperature, top_p, seeds,
                 counters, *, graphdef, rules, steps: int):
  """`steps` decode steps for the first `n = len(row_start)` rows (per-row sampling
  settings and PRNG streams); returns the cache and their tokens [n, steps].

  Only those rows are computed: with few requests live, a step costs what their
  rows cost, not the whole cache's.
  """
  with sharding_lib.axis_rules(rules):
    model = nnx.merge(graphdef, state)
    n = row_start.shape[0]
    slots = jnp.arange(k.shape[3], dtype=jnp.int32)[None]
    segment_ids = ((slots >= row_start[:, None]) & (slots < end)).astype(jnp.int32)
    full_k, full_v = k, v
    k, v = k[:, :n], v[:, :n]
    cache = KVCache(k=k, v=v, segment_ids=segment_ids, end=end)
    keys = jax.vmap(jax.random.key)(seeds)

    def step(carry, i):
      cache, last = carry
      hidden, cache = kv_cache.decode_step(model, last[:, None], (positions + i)[:, None], cache)
      step_keys = jax.vmap(jax.random.fold_in)(keys, counters + i)
      new = sampling_lib.sample_rows(model.logits(hidden)[:, 0], step_keys, temperature, top_p)
      return (cache, new), new

    (cache, _), tokens = jax.lax.scan(step, (cache, last), jnp.arange(steps, dtype=jnp.int32))
    zero = jnp.zeros((), jnp.int32)
    at = (zero,) * 5
    return (jax.lax.dynamic_update_slice(full_k, cache.k, at),
            jax.lax.dynamic_update_slice(full_v, cache.v, at), tokens.T)


def roll_rows(k, v, shift):
  """Moves every row's slots by `shift` (positive: right)."""
  return jnp.roll(k, shift, axis=3), jnp.roll(v, shift, axis=3)
