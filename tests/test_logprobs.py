"""Fused chunked log-probs against the naive full-logits log_softmax gather."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpsteer_jax.losses import logprobs

pytestmark = pytest.mark.version_tier


def _inputs(b=2, t=32, d=16, v=50, seed=0):
  k = jax.random.split(jax.random.key(seed), 4)
  hidden = jax.random.normal(k[0], (b, t, d))
  weight = jax.random.normal(k[1], (d, v)) * 0.5
  targets = jax.random.randint(k[2], (b, t), 0, v)
  weights = (jax.random.uniform(k[3], (b, t)) > 0.3).astype(jnp.float32)
  return hidden, weight, targets, weights


def _naive_logprobs(hidden, weight, targets):
  logits = jnp.einsum("btd,dv->btv", hidden, weight)
  return jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1)[..., 0]


@pytest.mark.parametrize("chunk", [0, 8, 32])
def test_token_logprobs_value_and_gradient(chunk):
  hidden, weight, targets, weights = _inputs()
  cot = jax.random.normal(jax.random.key(9), targets.shape)  # arbitrary per-token cotangent
  ours = jax.jit(logprobs.token_logprobs, static_argnums=3)(hidden, weight, targets, chunk)
  np.testing.assert_allclose(ours, _naive_logprobs(hidden, weight, targets), atol=1e-5)

  def f(fn):
    return lambda h, w: jnp.sum(fn(h, w) * cot)

  g_ours = jax.jit(jax.grad(f(lambda h, w: logprobs.token_logprobs(h, w, targets, chunk)),
                            argnums=(0, 1)))(hidden, weight)
  g_ref = jax.grad(f(lambda h, w: _naive_logprobs(h, w, targets)), argnums=(0, 1))(hidden, weight)
  for a, b in zip(g_ours, g_ref):
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("chunk", [0, 8])
def test_weighted_nll_value_and_gradient(chunk):
  hidden, weight, targets, weights = _inputs(seed=1)
  naive = lambda h, w: -jnp.sum(_naive_logprobs(h, w, targets) * weights)
  ours = lambda h, w: logprobs.weighted_nll(h, w, targets, weights, chunk)
  np.testing.assert_allclose(jax.jit(ours)(hidden, weight), naive(hidden, weight), rtol=1e-6)
  # Scale the loss after the fused op: the saved gradient must be scaled too.
  g_ours = jax.jit(jax.grad(lambda h, w: 0.37 * ours(h, w), argnums=(0, 1)))(hidden, weight)
  g_ref = jax.grad(lambda h, w: 0.37 * naive(h, w), argnums=(0, 1))(hidden, weight)
  for a, b in zip(g_ours, g_ref):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_chunk_must_divide_length():
  hidden, weight, targets, weights = _inputs(t=30)
  with pytest.raises(ValueError, match="multiple of the loss chunk"):
    logprobs.token_logprobs(hidden, weight, targets, 8)


@pytest.mark.parametrize("chunk, vocab_chunk", [(0, 0), (8, 0), (0, 10)])
def test_segment_logprob_sums_value_and_gradient(chunk, vocab_chunk):
  """Fused per-segment sums vs the naive log_softmax gather summed per segment."""
  hidden, weight, targets, _ = _inputs(seed=2)
  segs = jax.random.randint(jax.random.key(5), targets.shape, 0, 5)  # 0 = no segment
  cot = jax.random.normal(jax.random.key(6), (targets.shape[0], 4))

  def naive(h, w):
    lp = _naive_logprobs(h, w, targets)
    return jnp.stack([jnp.sum(jnp.where(segs == k, lp, 0.0), -1) for k in range(1, 5)], -1)

  ours = lambda h, w: logprobs.segment_logprob_sums(h, w, targets, segs, 4, chunk, vocab_chunk)
  np.testing.assert_allclose(jax.jit(ours)(hidden, weight), naive(hidden, weight), atol=1e-5)
  g_ours = jax.jit(jax.grad(lambda h, w: jnp.sum(ours(h, w) * cot), argnums=(0, 1)))(hidden, weight)
  g_ref = jax.grad(lambda h, w: jnp.sum(naive(h, w) * cot), argnums=(0, 1))(hidden, weight)
  for a, b in zip(g_ours, g_ref):
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("vocab_chunk", [7, 10, 50])
def test_vocab_chunked_logprobs_value_and_gradient(vocab_chunk):
  hidden, weight, targets, _ = _inputs(seed=3)
  cot = jax.random.normal(jax.random.key(7), targets.shape)
  ours = lambda h, w: logprobs.token_logprobs_vocab_chunked(h, w, targets, vocab_chunk)
  np.testing.assert_allclose(jax.jit(ours)(hidden, weight),
                             _naive_logprobs(hidden, weight, targets), atol=1e-5)
  g_ours = jax.jit(jax.grad(lambda h, w: jnp.sum(ours(h, w) * cot), argnums=(0, 1)))(hidden, weight)
  g_ref = jax.grad(lambda h, w: jnp.sum(_naive_logprobs(h, w, targets) * cot),
                   argnums=(0, 1))(hidden, weight)
  for a, b in zip(g_ours, g_ref):
    np.testing.assert_allclose(a, b, atol=1e-5)
  assert logprobs.vocab_chunks(128256, 4096) == 4008 and logprobs.vocab_chunks(50, 7) == 5


@pytest.mark.parametrize("fn", ["token", "vocab", "segments", "nll"])
def test_soft_capped_logprobs_value_and_gradient(fn):
  """Gemma 2's final soft-cap (HF Gemma2ForCausalLM: cap * tanh(logits / cap))
  applied inside the fused passes vs log_softmax of the capped full logits."""
  cap = 1.5
  hidden, weight, targets, weights = _inputs(seed=4)
  segs = jax.random.randint(jax.random.key(8), targets.shape, 0, 3)

  def naive_lp(h, w):
    logits = jnp.einsum("btd,dv->btv", h, w)
    logits = cap * jnp.tanh(logits / cap)
    return jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1)[..., 0]

  ours_lp = {
      "token": lambda h, w: logprobs.token_logprobs(h, w, targets, 8, cap),
      "vocab": lambda h, w: logprobs.token_logprobs_vocab_chunked(h, w, targets, 10, cap),
  }
  if fn in ours_lp:
    ours, naive = ours_lp[fn], naive_lp
  elif fn == "segments":
    ours = lambda h, w: logprobs.segment_logprob_sums(h, w, targets, segs, 2, 8, 0, cap)
    naive = lambda h, w: jnp.stack(
        [jnp.sum(jnp.where(segs == k, naive_lp(h, w), 0.0), -1) for k in (1, 2)], -1)
  else:
    ours = lambda h, w: logprobs.weighted_nll(h, w, targets, weights, 8, cap)
    naive = lambda h, w: -jnp.sum(naive_lp(h, w) * weights)
  np.testing.assert_allclose(jax.jit(ours)(hidden, weight), naive(hidden, weight), atol=1e-5)
  # The cap matters at this scale: uncapped log-probs differ.
  assert not np.allclose(naive_lp(hidden, weight), _naive_logprobs(hidden, weight, targets),
                         atol=1e-2)
  cot = jax.random.normal(jax.random.key(10), jnp.shape(naive(hidden, weight)))
  g_ours = jax.jit(jax.grad(lambda h, w: jnp.sum(ours(h, w) * cot), argnums=(0, 1)))(hidden, weight)
  g_ref = jax.grad(lambda h, w: jnp.sum(naive(h, w) * cot), argnums=(0, 1))(hidden, weight)
  for a, b in zip(g_ours, g_ref):
    np.testing.assert_allclose(a, b, atol=1e-5)
