"""Decode attention over the live span only (`models.live_attention`).

Both kernels must equal `attention.cached_attention` and a softmax attention
re-derived here in NumPy (HF's repeat_kv for grouped queries) on hand-made
caches: rows starting at different slots, a row with a hole in its visible
slots (two ranges), a row that sees nothing (finite zeros, never NaN), a
sliding window, a soft-cap and a query scale, fp32 and bf16, one compile for
every span.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpsteer_jax.models import attention, live_attention

B, H, K, D, S = 4, 4, 2, 16, 40


def _case(t: int, end: int, per_row_offset: bool = False):
  """q [B, t, H, D], heads-first k, v [B, K, S, D] and the mask of a decode step whose
  queries sit at slots end..end+t-1; returns (q, k, v, info, first, visible rows)."""
  rng = np.random.default_rng(t * 100 + end)
  q = rng.standard_normal((B, t, H, D)).astype(np.float32)
  k, v = (rng.standard_normal((B, K, S, D)).astype(np.float32) for _ in range(2))
  seg = np.zeros((B, S), np.int32)
  seg[0, 5:end + t] = 1                # starts at 5
  seg[1, 20:end + t] = 1               # starts at 20
  # row 2: padding only
  seg[3, 8:14] = 1                     # a hole: slots 8..13 and 22.. visible
  seg[3, 22:end + t] = 1
  offset = np.full(B, end, np.int32) if per_row_offset else end
  info = attention.MaskInfo(jnp.ones((B, t), jnp.int32), jnp.asarray(seg), offset)
  return q, k, v, info, 5, np.array([True, True, False, True])


def _reference(q, k, v, info, scale, window, softcap):
  """Softmax attention in float64 over the slots `dense_mask`'s rule keeps."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, t, h, d = q.shape
  seg = np.asarray(info.kv_segment_ids)
  q_pos = np.asarray(info.q_offset).reshape(-1, 1) + np.arange(t)[None]     # [b or 1, t]
  kv_pos = np.arange(k.shape[2])
  keep = (seg[:, None, :] != 0) & (kv_pos[None, None, :] <= q_pos[:, :, None])
  if window is not None:
    keep &= q_pos[:, :, None] - kv_pos[None, None, :] < window
  rep_k, rep_v = (np.repeat(x, h // x.shape[1], axis=1) for x in (k, v))    # [b, h, s, d]
  scores = np.einsum("bthd,bhsd->bhts", q, rep_k) * (d ** -0.5 if scale is None else scale)
  if softcap is not None:
    scores = softcap * np.tanh(scores / softcap)
  scores = np.where(keep[:, None], scores, -np.inf)
  scores -= np.max(np.where(keep[:, None], scores, -1e300), axis=-1, keepdims=True)
  p = np.exp(scores)
  p /= np.maximum(p.sum(-1, keepdims=True), 1e-300)
  return np.einsum("bhts,bhsd->bthd", p, rep_v)


def _kernels(block: int):
  return {
      "live": lambda q, k, v, info, first, **kw: live_attention.live_attention(
          q, k, v, info, first, block=block, **kw),
      "window": lambda q, k, v, info, first, **kw: live_attention.window_attention(
          q, k, v, info, first, sizes=live_attention.window_sizes(S, block), **kw),
  }


@pytest.mark.parametrize("kernel", ["live", "window"])
@pytest.mark.parametrize("t,end,block", [(1, 30, 8), (1, 39, 16), (3, 33, 8), (1, 30, 64),
                                         (1, 24, 4)])
@pytest.mark.parametrize("knobs", [{}, {"window": 6}, {"softcap": 5.0, "scale": 0.1},
                                   {"window": 12, "softcap": 2.0}])
def test_equals_cached_attention_and_numpy(kernel, t, end, block, knobs):
  """The last block clamped back into the buffer (end 39, block 16; end 30, block 64 >
  S / 2), several queries per row, windows shorter than the hole and than a row."""
  q, k, v, info, first, seen = _case(t, end)
  fn = jax.jit(lambda q, k, v, info, first: _kernels(block)[kernel](q, k, v, info, first,
                                                                   **knobs))
  ours = np.asarray(fn(q, k, v, info, jnp.int32(first)))
  dense = np.asarray(attention.cached_attention(q, k, v, info, **knobs))
  ref = _reference(q, k, v, info, knobs.get("scale"), knobs.get("window"), knobs.get("softcap"))
  assert np.isfinite(ours).all()
  sees = seen.copy()
  if knobs.get("window"):  # a row whose window holds none of its slots sees nothing
    sees &= np.isfinite(ref).all(axis=(1, 2, 3))
  np.testing.assert_allclose(ours[sees], dense[sees], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(ours[sees], ref[sees], atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(ours[~sees], 0.0)


@pytest.mark.parametrize("kernel", ["live", "window"])
def test_per_row_offsets_and_bf16(kernel):
  """Query offsets given per row ([B]); bf16 queries and caches within 2e-2 of the dense
  path in bf16."""
  q, k, v, info, first, seen = _case(1, 30, per_row_offset=True)
  run = _kernels(8)[kernel]
  ours = run(q, k, v, info, jnp.int32(first))
  np.testing.assert_allclose(np.asarray(ours)[seen],
                             np.asarray(attention.cached_attention(q, k, v, info))[seen],
                             atol=1e-5)
  qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
  ours = run(qb, kb, vb, info, jnp.int32(first))
  assert ours.dtype == jnp.bfloat16
  dense = attention.cached_attention(qb, kb, vb, info)
  np.testing.assert_allclose(np.asarray(ours, np.float32)[seen],
                             np.asarray(dense, np.float32)[seen], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("kernel", ["live", "window"])
def test_one_compile_serves_every_span_and_no_live_row_gives_zeros(kernel):
  """`first` and the offset are traced: spans of 1 to 35 slots share one compile; slots
  before `first` are never seen, even where the mask shows them (a window clamped back
  into the buffer starts before `first`). With `first` after the last slot (no live
  row) no block is read and the output is zeros."""
  fn = jax.jit(lambda q, k, v, info, first: _kernels(8)[kernel](q, k, v, info, first))
  q, k, v, info, _, seen = _case(1, 30)
  for first in (30, 17, 10, 5, 0):
    sliced = attention.MaskInfo(info.q_segment_ids,
                                info.kv_segment_ids * (np.arange(S) >= first), info.q_offset)
    out = np.asarray(fn(q, k, v, info, jnp.int32(first)))
    dense = np.asarray(attention.cached_attention(q, k, v, sliced))
    rows = seen & (np.asarray(sliced.kv_segment_ids).sum(1) > 0)
    np.testing.assert_allclose(out[rows], dense[rows], atol=1e-5)
  assert fn._cache_size() == 1
  empty = attention.MaskInfo(info.q_segment_ids, jnp.zeros((B, S), jnp.int32), info.q_offset)
  out = np.asarray(fn(q, k, v, empty, jnp.int32(31)))
  np.testing.assert_array_equal(out, 0.0)


def test_window_sizes_end_with_the_buffer():
  assert live_attention.window_sizes(264) == (64, 128, 192, 256, 264)
  assert live_attention.window_sizes(64) == (64,)
  assert live_attention.window_sizes(40, 16) == (16, 32, 40)
  with pytest.raises(ValueError, match="must end with"):
    q, k, v, info, first, _ = _case(1, 30)
    live_attention.window_attention(q, k, v, info, first, sizes=(8, 16))
