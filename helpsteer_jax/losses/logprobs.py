"""Per-token log-probabilities from hidden states, never materialising logits.

The vocabulary projection runs over sequence chunks; each chunk's logits
exist only inside one loop iteration, and the log-sum-exp is taken in fp32.

- `token_logprobs` returns log p(target) per token. Its custom VJP saves only
  the per-token log-sum-exp and recomputes each chunk's logits in the
  backward pass (4 vocabulary matmuls instead of 3, memory O(chunk x vocab)).
- `weighted_nll` returns sum_t w_t * -log p(target_t) for a scalar loss with
  fixed weights (SFT). It forms the gradient during the forward pass, so the
  vocabulary matmuls cost exactly what an unfused loss costs (3) while
  memory stays O(chunk x vocab).
- `token_logprobs_vocab_chunked` is the same over vocabulary chunks: the
  log-sum-exp is accumulated online, and in the backward pass each chunk's
  weight gradient is complete after one matmul over all tokens, so no fp32
  [hidden, vocab] accumulator exists (large vocabularies, long sequences).
- `segment_logprob_sums` sums either per segment id in one scatter-add
  (preference losses: per-response or per-sentence sums).

Each takes an optional final-logit soft-cap `softcap` (Gemma 2:
logits -> softcap * tanh(logits / softcap)); the backward multiplies the
capped logits' gradient by 1 - tanh^2, recomputed from the same chunk.

Each runs under a `jax.named_scope` ("fused_logprobs", "fused_logprobs_bwd",
"fused_nll", "segment_logprob_sums"), so profiles and HLO dumps name them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from helpsteer_jax import unrollable
from helpsteer_jax.sharding import constrain


def _chunks(length: int, chunk: int) -> tuple[int, int]:
  """(number of full chunks, chunk size); `chunk` <= 0 means one chunk."""
  if chunk <= 0 or chunk >= length:
    return 1, length
  if length % chunk:
    raise ValueError(f"sequence length {length} must be a multiple of the loss chunk"
                     f" size {chunk} (set loss_chunk_size to a divisor, or 0)")
  return length // chunk, chunk


def _slice(x, i, size):
  return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=1)


def _project(h, weight, softcap):
  """fp32 (soft-capped) logits of one chunk."""
  logits = jnp.einsum("btd,dv->btv", h, weight, preferred_element_type=jnp.float32)
  return logits if softcap is None else softcap * jnp.tanh(logits / softcap)


def _uncap(dlogits, logits, softcap):
  """The gradient w.r.t. the raw logits from the one w.r.t. the capped `logits`."""
  return dlogits if softcap is None else dlogits * (1.0 - jnp.square(logits / softcap))


def _chunk_stats(h, weight, targets, softcap):
  """fp32 logits of one chunk, their log-sum-exp and the target logits."""
  logits = _project(h, weight, softcap)
  lse = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  return logits, lse, target_logit


def _gathered(weight):
  # Gather the FSDP-sharded embed dim once, before the chunk loop.
  return constrain(weight, (None, "vocab"))


# ---------------------------------------------------------------------------
# Per-token log-probs (general cotangents).


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def token_logprobs(hidden: jax.Array, weight: jax.Array, targets: jax.Array,
                   chunk_size: int = 256, softcap: float | None = None) -> jax.Array:
  """log softmax(hidden @ weight)[targets] as fp32 [batch, length]."""
  return _token_logprobs_fwd(hidden, weight, targets, chunk_size, softcap)[0]


@jax.named_scope("fused_logprobs")
def _token_logprobs_fwd(hidden, weight, targets, chunk_size, softcap):
  weight = _gathered(weight)
  n, c = _chunks(hidden.shape[1], chunk_size)

  def body(i, acc):
    lp, lse_all = acc
    _, lse, tgt = _chunk_stats(_slice(hidden, i, c), weight, _slice(targets, i, c), softcap)
    lp = jax.lax.dynamic_update_slice_in_dim(lp, tgt - lse, i * c, axis=1)
    return lp, jax.lax.dynamic_update_slice_in_dim(lse_all, lse, i * c, axis=1)

  zeros = jnp.zeros(targets.shape, jnp.float32)
  logprobs, lse = unrollable.fori_loop(0, n, body, (zeros, zeros))
  return logprobs, (hidden, weight, targets, lse)


@jax.named_scope("fused_logprobs_bwd")
def _token_logprobs_bwd(chunk_size, softcap, residuals, g):
  hidden, weight, targets, lse = residuals
  n, c = _chunks(hidden.shape[1], chunk_size)

  def body(i, acc):
    dh, dw = acc
    h = _slice(hidden, i, c)
    logits = _project(h, weight, softcap)
    probs = jnp.exp(logits - _slice(lse, i, c)[..., None])
    onehot = jax.nn.one_hot(_slice(targets, i, c), weight.shape[1], dtype=jnp.float32)
    dlogits = _uncap(_slice(g, i, c)[..., None] * (onehot - probs), logits, softcap)
    dlogits = dlogits.astype(weight.dtype)
    dh_c = jnp.einsum("btv,dv->btd", dlogits, weight, preferred_element_type=jnp.float32)
    dw = dw + jnp.einsum("btd,btv->dv", h, dlogits, preferred_element_type=jnp.float32)
    return jax.lax.dynamic_update_slice_in_dim(dh, dh_c.astype(dh.dtype), i * c, axis=1), dw

  init = (jnp.zeros(hidden.shape, hidden.dtype), jnp.zeros(weight.shape, jnp.float32))
  dh, dw = unrollable.fori_loop(0, n, body, init)
  return dh, dw.astype(weight.dtype), None


token_logprobs.defvjp(_token_logprobs_fwd, _token_logprobs_bwd)


# ---------------------------------------------------------------------------
# Per-token log-probs over vocabulary chunks.
#
# Chunk i holds the vocabulary columns i, i + n, i + 2n, ... (n chunks): the
# weight is viewed as [hidden, chunk, n] and indexed on its minor axis, so a
# vocabulary sharded over the tensor axis stays sharded inside each chunk.


def vocab_chunks(vocab: int, requested: int) -> int:
  """The largest chunk size <= `requested` that divides `vocab`."""
  return max(c for c in range(1, min(requested, vocab) + 1) if vocab % c == 0)


def _vocab_view(weight, vocab_chunk):
  d, v = weight.shape
  c = vocab_chunks(v, vocab_chunk)
  return weight.reshape(d, c, v // c), v // c


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def token_logprobs_vocab_chunked(hidden: jax.Array, weight: jax.Array, targets: jax.Array,
                                 vocab_chunk: int = 4096,
                                 softcap: float | None = None) -> jax.Array:
  """log softmax(hidden @ weight)[targets] as fp32 [batch, length]."""
  return _vocab_fwd(hidden, weight, targets, vocab_chunk, softcap)[0]


@jax.named_scope("fused_logprobs")
def _vocab_fwd(hidden, weight, targets, vocab_chunk, softcap):
  w3, n = _vocab_view(weight, vocab_chunk)
  local, which = targets // n, targets % n

  def body(i, carry):
    m, s, tgt = carry
    logits = _project(hidden, w3[:, :, i], softcap)
    new_m = jnp.maximum(m, jnp.max(logits, -1))
    s = s * jnp.exp(m - new_m) + jnp.sum(jnp.exp(logits - new_m[..., None]), -1)
    t = jnp.take_along_axis(logits, local[..., None], -1)[..., 0]
    return new_m, s, jnp.where(which == i, t, tgt)

  zeros = jnp.zeros(targets.shape, jnp.float32)
  m, s, tgt = unrollable.fori_loop(0, n, body, (zeros - jnp.inf, zeros, zeros))
  lse = m + jnp.log(s)
  return tgt - lse, (hidden, weight, targets, lse)


@jax.named_scope("fused_logprobs_bwd")
def _vocab_bwd(vocab_chunk, softcap, residuals, g):
  hidden, weight, targets, lse = residuals
  w3, n = _vocab_view(weight, vocab_chunk)
  local, which = targets // n, targets % n
  c = w3.shape[1]

  def body(i, carry):
    dh, dw3 = carry
    w = w3[:, :, i]
    logits = _project(hidden, w, softcap)
    hit = (jnp.arange(c) == local[..., None]) & (which == i)[..., None]
    dlogits = _uncap(g[..., None] * (hit - jnp.exp(logits - lse[..., None])), logits, softcap)
    dlogits = dlogits.astype(weight.dtype)
    dh = dh + jnp.einsum("btv,dv->btd", dlogits, w, preferred_element_type=jnp.float32)
    dw = jnp.einsum("btd,btv->dv", hidden, dlogits, preferred_element_type=jnp.float32)
    return dh, dw3.at[:, :, i].set(dw.astype(dw3.dtype))

  init = (jnp.zeros(hidden.shape, jnp.float32), jnp.zeros(w3.shape, weight.dtype))
  dh, dw3 = unrollable.fori_loop(0, n, body, init)
  return dh.astype(hidden.dtype), dw3.reshape(weight.shape), None


token_logprobs_vocab_chunked.defvjp(_vocab_fwd, _vocab_bwd)


def segment_logprob_sums(hidden: jax.Array, weight: jax.Array, targets: jax.Array,
                         token_segments: jax.Array, num_segments: int,
                         chunk_size: int = 256, vocab_chunk: int = 0,
                         softcap: float | None = None) -> jax.Array:
  """Sums of log p(target) per segment: fp32 [batch, num_segments].

  token_segments: [batch, length] ints, k in 1..num_segments for a token of
  segment k, 0 for tokens that belong to none (prompt, padding). One
  scatter-add per row (vmapped, so batch sharding is kept). `vocab_chunk` > 0
  chunks the vocabulary instead of the sequence.
  """
  with jax.named_scope("segment_logprob_sums"):
    if vocab_chunk > 0:
      lp = token_logprobs_vocab_chunked(hidden, weight, targets, vocab_chunk, softcap)
    else:
      lp = token_logprobs(hidden, weight, targets, chunk_size, softcap)
    sums = jax.vmap(lambda x, ids: jax.ops.segment_sum(x, ids, num_segments + 1))(
        lp, token_segments)
    return sums[:, 1:]


# ---------------------------------------------------------------------------
# Weighted negative log-likelihood (scalar loss, gradient formed forward).


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def weighted_nll(hidden: jax.Array, weight: jax.Array, targets: jax.Array,
                 weights: jax.Array, chunk_size: int = 256,
                 softcap: float | None = None) -> jax.Array:
  """sum over tokens of weights * -log softmax(hidden @ weight)[targets] (fp32)."""
  with jax.named_scope("fused_nll"):
    weight = _gathered(weight)
    n, c = _chunks(hidden.shape[1], chunk_size)

    def body(i, total):
      _, lse, tgt = _chunk_stats(_slice(hidden, i, c), weight, _slice(targets, i, c), softcap)
      return total + jnp.sum((lse - tgt) * _slice(weights, i, c))

    return unrollable.fori_loop(0, n, body, jnp.zeros((), jnp.float32))


@jax.named_scope("fused_nll")
def _weighted_nll_fwd(hidden, weight, targets, weights, chunk_size, softcap):
  weight = _gathered(weight)
  n, c = _chunks(hidden.shape[1], chunk_size)

  def body(i, acc):
    total, dh, dw = acc
    h, w = _slice(hidden, i, c), _slice(weights, i, c)
    logits, lse, tgt = _chunk_stats(h, weight, _slice(targets, i, c), softcap)
    probs = jnp.exp(logits - lse[..., None])
    onehot = jax.nn.one_hot(_slice(targets, i, c), weight.shape[1], dtype=jnp.float32)
    dlogits = _uncap(w[..., None] * (probs - onehot), logits, softcap).astype(weight.dtype)
    dh_c = jnp.einsum("btv,dv->btd", dlogits, weight, preferred_element_type=jnp.float32)
    dw = dw + jnp.einsum("btd,btv->dv", h, dlogits, preferred_element_type=jnp.float32)
    dh = jax.lax.dynamic_update_slice_in_dim(dh, dh_c.astype(dh.dtype), i * c, axis=1)
    return total + jnp.sum((lse - tgt) * w), dh, dw

  init = (jnp.zeros((), jnp.float32), jnp.zeros(hidden.shape, hidden.dtype),
          jnp.zeros(weight.shape, jnp.float32))
  total, dh, dw = unrollable.fori_loop(0, n, body, init)
  return total, (dh, dw.astype(weight.dtype))


@jax.named_scope("fused_nll_bwd")
def _weighted_nll_bwd(chunk_size, softcap, residuals, g):
  dh, dw = residuals
  return (g * dh).astype(dh.dtype), (g * dw).astype(dw.dtype), None, None


weighted_nll.defvjp(_weighted_nll_fwd, _weighted_nll_bwd)
