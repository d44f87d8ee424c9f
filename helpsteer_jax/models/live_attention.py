"""Decode attention that reads only the cache slots the live rows use.

`attention.cached_attention` reads every slot of a cache buffer: the engine's
buffers hold a power of two plus a chunk of slots above the live rows' span.
These kernels take `first`, a traced scalar (the first slot any live row
uses); the last slot is that of the newest query, `max(q_offset) + T - 1`.
One compile serves every span:

- `live_attention` loops over ceil(span / block) blocks of `block` slots
  (a `fori_loop` with a traced trip count, a dynamic slice per block) with an
  online softmax in fp32 (the flash-attention recurrence of running max,
  normaliser and output, Dao et al. 2022).
- `window_attention` picks (`lax.switch`) the smallest of a few static window
  sizes that holds the span (`window_sizes`: multiples of a step), slices
  that one window and runs the dense path on it: no loop, less than a step
  of slots read beyond the span.
On XLA:CPU the loop is the faster of the two, and faster than the dense path
(`benchmarks/decode_attention.py`, docs/results.md).

Slots before `first` are never read. Both equal `cached_attention` wherever
a query sees at least one slot and none before `first`: keys are kept by the
same rule (`attention.dense_mask`: same non-zero segment, causal, within the
sliding `window`), so a row's visible slots may be two
ranges (a hole in `kv_segment_ids`). A query that sees no slot returns zeros
(the dense path returns the mean of all slots' values there; both are
finite, and both are meaningless). Queries [B, T, H, D], caches [B, K, S, D]
(heads first, K divides H), returns [B, T, H, D] in q's dtype.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from helpsteer_jax.models.attention import NEG_INF, MaskInfo, cached_attention, dense_mask


def _span(q, info: MaskInfo, first, window: int | None):
  """(first, last) slot any query may see: `window` raises `first` to the oldest
  query's window start."""
  offset = jnp.asarray(info.q_offset, jnp.int32)
  last = jnp.max(offset) + q.shape[1] - 1
  first = jnp.asarray(first, jnp.int32)
  if window is not None:
    first = jnp.maximum(first, jnp.min(offset) - window + 1)
  return jnp.maximum(first, 0), last


def _scaled_groups(q, kv_heads: int, scale: float | None):
  """[B, T, H, D] -> pre-scaled [B, T, K, H/K, D] (scaled in q's dtype, as `_dense`)."""
  b, t, h, d = q.shape
  scale = d ** -0.5 if scale is None else scale
  return q.reshape(b, t, kv_heads, h // kv_heads, d) * jnp.asarray(scale, q.dtype)


def live_attention(q, k, v, info: MaskInfo, first, *, block: int = 64,
                   scale: float | None = None, window: int | None = None,
                   softcap: float | None = None) -> jax.Array:
  """Queries [B, T, H, D] over cache slots [first, max(q_offset) + T) of k, v [B, K, S, D],
  `block` slots at a time (a traced number of blocks)."""
  b, t, h, d = q.shape
  kv_heads, slots = k.shape[1], k.shape[2]
  block = min(block, slots)
  first, last = _span(q, info, first, window)
  blocks = jnp.maximum(last - first + block, 0) // block  # ceil(span / block), 0 if empty
  qg = _scaled_groups(q, kv_heads, scale)
  q_idx = jnp.arange(t)[None, :] + jnp.asarray(info.q_offset, jnp.int32).reshape(-1, 1)

  def body(i, carry):
    m, norm, acc = carry
    start = first + i * block
    # The last block may be clamped back into the buffer: its slots before `start`
    # were read by the block before it.
    at = jnp.minimum(start, slots - block)
    kb = jax.lax.dynamic_slice_in_dim(k, at, block, axis=2)
    vb = jax.lax.dynamic_slice_in_dim(v, at, block, axis=2)
    seg = jax.lax.dynamic_slice_in_dim(info.kv_segment_ids, at, block, axis=1)
    kv_idx = at + jnp.arange(block)
    keep = ((info.q_segment_ids[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
            & (kv_idx[None, None, :] <= q_idx[:, :, None]) & (kv_idx >= start)[None, None, :])
    if window is not None:
      keep &= q_idx[:, :, None] - kv_idx[None, None, :] < window
    keep = keep[:, None, None]  # [B, 1, 1, T, block]
    s = jnp.einsum("btkgd,bksd->bkgts", qg, kb, preferred_element_type=jnp.float32)
    if softcap is not None:
      s = softcap * jnp.tanh(s / softcap)
    s = jnp.where(keep, s, NEG_INF)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    p = jnp.where(keep, jnp.exp(s - m_new[..., None]), 0.0)
    alpha = jnp.exp(m - m_new)
    pv = jnp.einsum("bkgts,bksd->bkgtd", p.astype(v.dtype), vb).astype(jnp.float32)
    return m_new, alpha * norm + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv

  g = h // kv_heads
  init = (jnp.full((b, kv_heads, g, t), NEG_INF, jnp.float32),
          jnp.zeros((b, kv_heads, g, t), jnp.float32),
          jnp.zeros((b, kv_heads, g, t, d), jnp.float32))
  with jax.named_scope("live_attention"):
    _, norm, acc = jax.lax.fori_loop(0, blocks, body, init)
  out = jnp.where(norm[..., None] > 0, acc / jnp.where(norm > 0, norm, 1.0)[..., None], 0.0)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(q.dtype)


def window_sizes(slots: int, step: int = 64) -> tuple[int, ...]:
  """Window sizes for `window_attention`: the multiples of `step` below `slots`, then
  `slots`."""
  return (*range(step, slots, step), slots)


def window_attention(q, k, v, info: MaskInfo, first, *, sizes: Sequence[int],
                     scale: float | None = None, window: int | None = None,
                     softcap: float | None = None) -> jax.Array:
  """Queries [B, T, H, D] over one window of k, v [B, K, S, D]: the smallest of the static
  `sizes` (ascending, the last one S) that holds slots [first, max(q_offset) + T)."""
  slots = k.shape[2]
  if sizes[-1] != slots:
    raise ValueError(f"window sizes {tuple(sizes)} must end with the cache's {slots} slots")
  first, last = _span(q, info, first, window)
  need = last - first + 1
  which = jnp.sum(jnp.asarray(sizes[:-1]) < need)

  def branch(size):
    def run(q, k, v, info, first):
      at = jnp.clip(first, 0, slots - size)
      ks, vs = (jax.lax.dynamic_slice_in_dim(x, at, size, axis=2) for x in (k, v))
      seg = jax.lax.dynamic_slice_in_dim(info.kv_segment_ids, at, size, axis=1)
      # A window clamped back into the buffer starts before `first`: hide those slots.
      seg = jnp.where(at + jnp.arange(size) >= first, seg, 0)
      sliced = MaskInfo(info.q_segment_ids, seg, jnp.asarray(info.q_offset) - at)
      out = cached_attention(q, ks, vs, sliced, scale=scale, window=window, softcap=softcap)
      sees = dense_mask(sliced, q.shape[1], size, window).any(-1)  # [B, T]
      return jnp.where(sees[:, :, None, None], out, jnp.zeros((), out.dtype))
    return run

  with jax.named_scope("window_attention"):
    return jax.lax.switch(which, [branch(s) for s in sizes], q, k, v, info, first)
