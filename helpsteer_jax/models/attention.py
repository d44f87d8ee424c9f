"""Causal attention with padding and packing, behind one seam.

Every implementation takes queries [B, T, H, D], keys and values [B, S, K, D]
(K divides H: grouped-query attention) and a `MaskInfo`, and returns
[B, T, H, D]. A query attends to a key when both carry the same non-zero
segment id and the key's index is not after the query's (and, with a
sliding `window`, fewer than `window` indices before it). Segment id 0 marks
padding (its rows produce finite values that losses mask out). Scores are
q.k times `scale` (default 1/sqrt(D)), then soft-capped to
`softcap * tanh(scores / softcap)` when `softcap` is set (Gemma 2).

`attention_impl` selects the kernel:
- `xla`: `jax.nn.dot_product_attention` with an explicit mask.
- `blockwise`: a flash-style kernel in plain JAX (custom VJP). It loops over
  one (batch, kv-head) group at a time and over query blocks that see only
  keys from their window's start to their own end, so it skips the masked
  upper triangle and the keys left of a sliding window, keeps each score
  block cache-sized, and the backward pass recomputes scores from the saved
  log-sum-exp instead of storing a T x S matrix. Fastest on CPU.
- `splash`: Pallas splash attention (TPU): causal (or `LocalMask` sliding
  window) mask + segment ids, block sparse, the kernel's own logit
  soft-cap, flash-style backward; per device under `shard_map`.
- `cudnn`: cuDNN flash attention (GPU) through
  `jax.nn.dot_product_attention(implementation="cudnn")`; bf16 / fp16 only,
  no soft-capping (a `ConfigError` from `ModelConfig`).
The accelerator kernels only exist on their platform: `check_platform`
rejects a mismatch before anything compiles.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax import unrollable

NEG_INF = -0.7 * float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class MaskInfo:
  """What decides which key each query may see.

  q_segment_ids: [B, T] int; kv_segment_ids: [B, S] int (0 = padding).
  q_offset: index of query 0 within the key sequence (0 for training; the
    cache position when decoding), scalar or [B]. With a static 0 and equal
    lengths, queries and keys are the same sequence (self-attention).
  """

  q_segment_ids: jax.Array
  kv_segment_ids: jax.Array
  q_offset: jax.Array | int = 0


jax.tree_util.register_dataclass(
    MaskInfo, data_fields=["q_segment_ids", "kv_segment_ids", "q_offset"],
    meta_fields=[])


def dense_mask(info: MaskInfo, q_len: int, kv_len: int, window: int | None = None
               ) -> jax.Array:
  """Boolean [B, q_len, kv_len]: same non-zero segment, causal, within the window."""
  offset = jnp.asarray(info.q_offset).reshape(-1, 1, 1)
  q_idx = jnp.arange(q_len)[None, :, None] + offset
  kv_idx = jnp.arange(kv_len)[None, None, :]
  q_seg = info.q_segment_ids[:, :, None]
  kv_seg = info.kv_segment_ids[:, None, :]
  keep = (q_seg == kv_seg) & (kv_seg != 0) & (kv_idx <= q_idx)
  if window is not None:
    keep &= q_idx - kv_idx < window
  return keep


def _softcap(scores: jax.Array, softcap: float | None) -> jax.Array:
  return scores if softcap is None else softcap * jnp.tanh(scores / softcap)


def xla_attention(q, k, v, info: MaskInfo, scale: float | None = None,
                  window: int | None = None, softcap: float | None = None) -> jax.Array:
  mask = dense_mask(info, q.shape[1], k.shape[1], window)
  if softcap is None:
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=scale,
                                        implementation="xla")
  heads_first = lambda x: x.transpose(0, 2, 1, 3)
  return _dense(q, heads_first(k), heads_first(v), mask, scale, softcap)


def cached_attention(q, k, v, info: MaskInfo, scale: float | None = None,
                     window: int | None = None, softcap: float | None = None) -> jax.Array:
  """Queries [B, T, H, D] against a cached layer k, v [B, K, S, D] (heads first).

  Decoding's dense path: both matmuls batch over (batch, kv head) and read
  the cache in its stored layout; only the few new queries are transposed.
  With a sliding window shorter than the cache (and one offset for every
  row, as the decoder's), only the window's slots are read. Scores and
  softmax in fp32; returns [B, T, H, D].
  """
  with jax.named_scope("cached_attention"):
    t, slots = q.shape[1], k.shape[2]
    span = None if window is None else window + t - 1
    if span is not None and span < slots and jnp.ndim(info.q_offset) == 0:
      first = jnp.clip(jnp.asarray(info.q_offset) - window + 1, 0, slots - span)
      k, v = (jax.lax.dynamic_slice_in_dim(x, first, span, axis=2) for x in (k, v))
      info = MaskInfo(info.q_segment_ids,
                      jax.lax.dynamic_slice_in_dim(info.kv_segment_ids, first, span, axis=1),
                      info.q_offset - first)
    return _dense(q, k, v, dense_mask(info, t, k.shape[2], window), scale, softcap)


def _dense(q, k, v, mask, scale, softcap) -> jax.Array:
  """GQA softmax attention of q [B, T, H, D] over heads-first k, v [B, K, S, D]."""
  b, t, h, d = q.shape
  kv_heads = k.shape[1]
  scale = d ** -0.5 if scale is None else scale
  q = q.reshape(b, t, kv_heads, h // kv_heads, d) * jnp.asarray(scale, q.dtype)
  scores = jnp.einsum("btkgd,bksd->bkgts", q, k, preferred_element_type=jnp.float32)
  scores = _softcap(scores, softcap)
  probs = jax.nn.softmax(jnp.where(mask[:, None, None], scores, NEG_INF), axis=-1)
  # No fp32 output for probs . v: XLA:CPU has no batched bf16 x bf16 -> f32 dot, and the
  # output is rounded to q's dtype anyway (accelerators accumulate in fp32 regardless).
  out = jnp.einsum("bkgts,bksd->btkgd", probs.astype(v.dtype), v)
  return out.reshape(b, t, h, d).astype(q.dtype)


# ---------------------------------------------------------------------------
# Blockwise (flash-style) attention for one group: q [G, T, D], k/v [T, D].


def _query_blocks(length: int, block: int) -> list[tuple[int, int]]:
  return [(s, min(s + block, length)) for s in range(0, length, block)]


def _first_key(start: int, window: int | None) -> int:
  """The first key a query block starting at `start` can see."""
  return 0 if window is None else max(0, start - window + 1)


def _block_scores(q_blk, k, seg, start, stop, window, softcap):
  """Masked fp32 scores of (pre-scaled) queries start:stop against keys lo:stop.

  Keys left of the block's window (lo = its first query's window start) are
  never computed. Also returns tanh(raw / softcap) for the soft-cap's
  derivative (None without soft-capping).
  """
  lo = _first_key(start, window)
  s = jnp.einsum("gtd,sd->gts", q_blk, k[lo:stop], preferred_element_type=jnp.float32)
  t = None
  if softcap is not None:
    t = jnp.tanh(s / softcap)
    s = softcap * t
  q_idx = jnp.arange(start, stop)[:, None]
  kv_idx = jnp.arange(lo, stop)[None, :]
  kv_seg = seg[None, lo:stop]
  keep = (kv_idx <= q_idx) & (seg[start:stop, None] == kv_seg) & (kv_seg != 0)
  if window is not None:
    keep &= q_idx - kv_idx < window
  return jnp.where(keep[None], s, NEG_INF), t, lo


def _group_forward(q, k, v, seg, block, window, softcap):
  """q is pre-scaled."""
  outs, lses = [], []
  for start, stop in _query_blocks(q.shape[1], block):
    s, _, lo = _block_scores(q[:, start:stop], k, seg, start, stop, window, softcap)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.einsum("gts,sd->gtd", p.astype(v.dtype), v[lo:stop],
                   preferred_element_type=jnp.float32) / denom
    outs.append(o.astype(q.dtype))
    lses.append((m + jnp.log(denom))[..., 0])
  return jnp.concatenate(outs, axis=1), jnp.concatenate(lses, axis=1)


def _group_backward(q, k, v, seg, out, lse, dout, block, window, softcap):
  """Gradients w.r.t. the pre-scaled q and, transposed ([D, S]), k and v.

  dk and dv accumulate as dk^T = q^T ds and dv^T = dout^T p: the operand
  transposed for the matmul is then the small [block, D] query block, not
  the [block, S] score block (on CPU that transpose cost ~15% of the pass).
  """
  delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
  dq = []
  dk_t = jnp.zeros(k.shape[::-1], jnp.float32)
  dv_t = jnp.zeros(v.shape[::-1], jnp.float32)
  for start, stop in _query_blocks(q.shape[1], block):
    q_blk, do_blk = q[:, start:stop], dout[:, start:stop]
    s, t, lo = _block_scores(q_blk, k, seg, start, stop, window, softcap)
    p = jnp.exp(s - lse[:, start:stop, None])
    dv_t = dv_t.at[:, lo:stop].add(jnp.einsum("gtd,gts->ds", do_blk, p.astype(dout.dtype),
                                              preferred_element_type=jnp.float32))
    dp = jnp.einsum("gtd,sd->gts", do_blk, v[lo:stop], preferred_element_type=jnp.float32)
    ds = p * (dp - delta[:, start:stop, None])
    if t is not None:
      ds = ds * (1.0 - t * t)  # d(c * tanh(s / c)) / ds
    ds = ds.astype(q.dtype)
    dq.append(jnp.einsum("gts,sd->gtd", ds, k[lo:stop], preferred_element_type=jnp.float32))
    dk_t = dk_t.at[:, lo:stop].add(jnp.einsum("gtd,gts->ds", q_blk, ds,
                                              preferred_element_type=jnp.float32))
  return (jnp.concatenate(dq, axis=1).astype(q.dtype), dk_t.astype(k.dtype),
          dv_t.astype(v.dtype))


def _to_groups(x, kv_heads):
  """[B, T, H, D] -> [B*K, H/K, T, D]."""
  b, t, h, d = x.shape
  return x.reshape(b, t, kv_heads, h // kv_heads, d).transpose(0, 2, 3, 1, 4).reshape(
      b * kv_heads, h // kv_heads, t, d)


def _from_groups(x, batch):
  """[B*K, G, T, D] -> [B, T, K*G, D]."""
  bk, g, t, d = x.shape
  k = bk // batch
  return x.reshape(batch, k, g, t, d).transpose(0, 3, 1, 2, 4).reshape(batch, t, k * g, d)


def _kv_groups(x):
  """[B, S, K, D] -> [B*K, S, D]."""
  b, s, k, d = x.shape
  return x.transpose(0, 2, 1, 3).reshape(b * k, s, d)


def _kv_ungroup_transposed(x, batch):
  """[B*K, D, S] -> [B, S, K, D]."""
  bk, d, s = x.shape
  return x.reshape(batch, bk // batch, d, s).transpose(0, 3, 1, 2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _blockwise(q, k, v, segment_ids, block, scale, window, softcap):
  return _blockwise_fwd(q, k, v, segment_ids, block, scale, window, softcap)[0]


def _blockwise_fwd(q, k, v, segment_ids, block, scale, window, softcap):
  b, kv_heads = q.shape[0], k.shape[2]
  seg = jnp.repeat(segment_ids, kv_heads, axis=0)
  q_scaled = _to_groups(q * scale, kv_heads)
  k_groups, v_groups = _kv_groups(k), _kv_groups(v)
  with jax.named_scope("blockwise_fwd"):
    out, lse = unrollable.map_(lambda a: _group_forward(*a, block, window, softcap),
                           (q_scaled, k_groups, v_groups, seg))
  # The backward pass works in the grouped layout: keep that layout, so it
  # does not transpose q, k and v a second time.
  return _from_groups(out, b), (q_scaled, k_groups, v_groups, seg, out, lse)


def _blockwise_bwd(block, scale, window, softcap, residuals, dout):
  q_scaled, k_groups, v_groups, seg, out, lse = residuals
  b = dout.shape[0]
  kv_heads = k_groups.shape[0] // b
  with jax.named_scope("blockwise_bwd"):
    dq, dk, dv = unrollable.map_(
        lambda a: _group_backward(*a, block, window, softcap),
        (q_scaled, k_groups, v_groups, seg, out, lse, _to_groups(dout, kv_heads)))
  return (_from_groups(dq, b) * scale, _kv_ungroup_transposed(dk, b),
          _kv_ungroup_transposed(dv, b),
          np.zeros((b, seg.shape[1]), jax.dtypes.float0))


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def blockwise_attention(q, k, v, segment_ids, block_size: int, scale: float | None = None,
                        window: int | None = None, softcap: float | None = None
                        ) -> jax.Array:
  """Flash-style causal self-attention (queries and keys are one sequence)."""
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  return _blockwise(q, k, v, segment_ids, block_size, scale, window, softcap)


def _local(fn, q, k, v, segment_ids):
  """Runs `fn` on each device's shard: batch and heads are independent."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return fn(q, k, v, segment_ids)
  rules = sharding_lib.active_rules()
  q_spec = sharding_lib.logical_to_spec(("batch", "length", "heads", "head_dim"), rules)
  kv_spec = sharding_lib.logical_to_spec(("batch", "length", "kv_heads", "head_dim"), rules)
  seg_spec = PartitionSpec(q_spec[0], q_spec[1])
  return jax.shard_map(fn, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, seg_spec),
                       out_specs=q_spec, check_vma=False)(q, k, v, segment_ids)


KERNEL_PLATFORMS = {"splash": ("tpu",), "cudnn": ("gpu", "cuda")}


def check_platform(impl: str, platform: str) -> None:
  """A `ConfigError` when `impl` is a kernel for another accelerator."""
  wanted = KERNEL_PLATFORMS.get(impl)
  if wanted and platform not in wanted:
    from helpsteer_jax.errors import ConfigError
    raise ConfigError(
        f"model.attention_impl={impl!r} runs only on {wanted[0].upper()}, but the devices"
        f" are {platform!r}; use --config.model.attention_impl=blockwise (or xla) here,"
        " or splash on TPU / cudnn on GPU")


def splash_attention(q, k, v, segment_ids, block_size: int, interpret: bool = False,
                     scale: float | None = None, window: int | None = None,
                     softcap: float | None = None) -> jax.Array:
  """Pallas splash attention on one device's shard (causal, packed segments).

  The kernel is built for the local head count; q is pre-scaled (splash
  does not scale). A sliding window is a `LocalMask` (its block sparsity
  skips the blocks left of the window) and the soft-cap is the kernel's
  `attn_logits_soft_cap`. Padding (segment 0) rows attend to padding only,
  so their finite outputs never reach a real token.
  """
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
  _, length, heads, head_dim = q.shape
  block = min(block_size, length)
  scale = head_dim ** -0.5 if scale is None else scale
  if window is None or window >= length:
    one = sm.CausalMask((length, length))
  else:
    one = sm.LocalMask((length, length), window_size=(window - 1, 0), offset=0)
  mask = sm.MultiHeadMask([one for _ in range(heads)])
  sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                        block_q_dq=block, block_kv_dq=block)
  kernel = sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                              attn_logits_soft_cap=softcap, interpret=interpret)
  heads_first = lambda x: x.transpose(0, 2, 1, 3)
  seg = sk.SegmentIds(q=segment_ids, kv=segment_ids)
  out = jax.vmap(kernel)(heads_first(q * jnp.asarray(scale, q.dtype)),
                         heads_first(k), heads_first(v), seg)
  return heads_first(out)


def cudnn_attention(q, k, v, segment_ids, scale: float | None = None,
                    window: int | None = None) -> jax.Array:
  """cuDNN flash attention: causal, segments (and window) as a mask (GQA by cuDNN)."""
  info = MaskInfo(segment_ids, segment_ids, 0)
  mask = dense_mask(info, q.shape[1], k.shape[1], window)[:, None]
  return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=True,
                                      implementation="cudnn")


def attention(q, k, v, info: MaskInfo, impl: str, block_size: int = 256, *,
              scale: float | None = None, window: int | None = None,
              softcap: float | None = None) -> jax.Array:
  """Dispatches to the configured attention implementation.

  `window` (sliding window, keys per query) and `softcap` are static.
  """
  with jax.named_scope(f"attention_{impl}"):
    return _dispatch(q, k, v, info, impl, block_size, scale, window, softcap)


def _dispatch(q, k, v, info, impl, block_size, scale, window, softcap) -> jax.Array:
  if impl == "xla":
    return xla_attention(q, k, v, info, scale, window, softcap)
  if impl in ("blockwise", "splash", "cudnn"):
    self_attention = (q.shape[1] == k.shape[1] and isinstance(info.q_offset, int)
                      and info.q_offset == 0)
    if not self_attention:
      # Queries offset into the keys (the model decodes through
      # `cached_attention` instead): the dense path is exact.
      return xla_attention(q, k, v, info, scale, window, softcap)
    if impl == "cudnn" and softcap is not None:
      from helpsteer_jax.errors import ConfigError
      raise ConfigError("attention_impl='cudnn' cannot soft-cap attention logits; use"
                        " blockwise, xla or splash")
    knobs = dict(scale=scale, window=window)
    fn = {"blockwise": functools.partial(blockwise_attention, block_size=block_size,
                                         softcap=softcap, **knobs),
          "splash": functools.partial(splash_attention, block_size=block_size,
                                      softcap=softcap, **knobs),
          "cudnn": functools.partial(cudnn_attention, **knobs)}[impl]
    return _local(fn, q, k, v, info.q_segment_ids)
  raise ValueError(f"attention_impl={impl!r} is not available on this build;"
                   " use 'xla', 'blockwise', 'splash' (TPU) or 'cudnn' (GPU)")
