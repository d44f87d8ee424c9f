"""Top-k / top-p filters against transformers' logits warpers and NumPy.

References: transformers `TemperatureLogitsWarper`, `TopKLogitsWarper` and
`TopPLogitsWarper` (applied in that order by `generate`), and the definitions
re-derived in NumPy: top-k keeps logits >= the k-th largest; top-p keeps a
token when the probability mass of the tokens ranked above it is < p.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from torch_reference import needs_torch, torch

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import sampling


def _logits(seed=0, shape=(4, 50)):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32) * 2.0


def _np_top_k(x, k):
  kth = np.sort(x, axis=-1)[:, ::-1][:, k - 1: k]
  return x >= kth


def _np_top_p(x, p):
  keep = np.zeros(x.shape, bool)
  for r, row in enumerate(x.astype(np.float64)):
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    order = np.argsort(-row, kind="stable")
    mass_before = 0.0
    for j in order:
      if mass_before < p or j == order[0]:
        keep[r, j] = True
      mass_before += probs[j]
  return keep


def _warper_keeps(warper, x):
  """The tokens transformers' logits warper leaves finite."""
  return warper(None, torch.from_numpy(x)).numpy() > -np.inf


_TIES = np.array([[3.0, 1.0, 2.0, 2.0, 0.0]], np.float32)


@pytest.mark.parametrize("k", [1, 5, 17, 50])
def test_top_k_keeps_exactly_the_k_largest(k):
  x = _logits()
  ours = np.asarray(sampling.top_k_mask(jnp.asarray(x), k))
  np.testing.assert_array_equal(ours, _np_top_k(x, k))
  assert (ours.sum(-1) == k).all()


def test_top_k_keeps_ties_at_the_boundary():
  ours = np.asarray(sampling.top_k_mask(jnp.asarray(_TIES), 2))
  np.testing.assert_array_equal(ours[0], [True, False, True, True, False])


@needs_torch
@pytest.mark.parametrize("x,k", [(_logits(), 1), (_logits(), 5), (_logits(), 17),
                                 (_logits(), 50), (_TIES, 2)],
                         ids=["k1", "k5", "k17", "k50", "ties"])
def test_top_k_matches_transformers_warper(x, k):
  ours = np.asarray(sampling.top_k_mask(jnp.asarray(x), k))
  np.testing.assert_array_equal(ours, _warper_keeps(transformers.TopKLogitsWarper(top_k=k), x))


@pytest.mark.parametrize("p", [0.05, 0.3, 0.75, 0.95])
def test_top_p_keeps_the_nucleus(p):
  x = _logits(seed=1)
  ours = np.asarray(sampling.top_p_mask(jnp.asarray(x), p))
  np.testing.assert_array_equal(ours, _np_top_p(x, p))


@needs_torch
@pytest.mark.parametrize("p", [0.05, 0.3, 0.75, 0.95])
def test_top_p_matches_transformers_warper(p):
  x = _logits(seed=1)
  ours = np.asarray(sampling.top_p_mask(jnp.asarray(x), p))
  np.testing.assert_array_equal(ours, _warper_keeps(transformers.TopPLogitsWarper(top_p=p), x))


@needs_torch
def test_filter_matches_transformers_warper_chain():
  x = _logits(seed=2)
  cfg = sampling.SamplingConfig(temperature=0.7, top_k=20, top_p=0.8)
  ours = np.asarray(sampling.filter_logits(jnp.asarray(x), cfg))
  t = torch.from_numpy(x)
  for warper in (transformers.TemperatureLogitsWarper(0.7), transformers.TopKLogitsWarper(20),
                 transformers.TopPLogitsWarper(0.8)):
    t = warper(None, t)
  ref = t.numpy()
  np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(ref))
  np.testing.assert_allclose(ours[np.isfinite(ours)], ref[np.isfinite(ref)], rtol=1e-6)


def test_samples_only_come_from_the_kept_tokens():
  x = jnp.asarray(_logits(seed=3, shape=(2, 50)))
  cfg = sampling.SamplingConfig(temperature=1.0, top_k=3)
  keys = jax.random.split(jax.random.key(0), 200)
  draws = np.asarray(jax.vmap(lambda k: sampling.next_token(x, k, cfg))(keys))
  allowed = _np_top_k(np.asarray(x), 3)
  for row in range(2):
    assert set(draws[:, row].tolist()) <= set(np.flatnonzero(allowed[row]).tolist())
    assert len(set(draws[:, row].tolist())) > 1
  greedy = sampling.next_token(x, keys[0], sampling.SamplingConfig())
  np.testing.assert_array_equal(np.asarray(greedy), np.argmax(np.asarray(x), -1))


@pytest.mark.parametrize("vocab", [50, 300])
def test_categorical_draws_follow_the_softmax(vocab):
  """The two-level inverse-CDF draw: frequencies within sampling error of softmax(logits)
  (vocabularies shorter than and not a multiple of its block), -inf entries never drawn,
  the same key giving the same token."""
  rng = np.random.RandomState(vocab)
  logits = rng.randn(2, vocab).astype(np.float32) * 2
  logits[0, ::3] = -np.inf
  logits[1, :vocab - 1] = -np.inf  # one token left: always drawn
  draws = 40_000
  keys = jax.random.split(jax.random.key(1), draws * 2).reshape(draws, 2)
  got = np.asarray(jax.jit(jax.vmap(sampling.categorical, (0, None)))(
      keys, jnp.asarray(logits)))
  probs = np.exp(logits[0] - logits[0][np.isfinite(logits[0])].max())
  probs /= probs.sum()
  freq = np.bincount(got[:, 0], minlength=vocab) / draws
  assert freq[::3].sum() == 0
  np.testing.assert_allclose(freq, probs, atol=4 * np.sqrt(probs.max() / draws))
  assert set(got[:, 1].tolist()) == {vocab - 1}
  again = jax.vmap(sampling.categorical, (0, None))(keys[:5], jnp.asarray(logits))
  np.testing.assert_array_equal(np.asarray(again), got[:5])


def test_argmax_takes_the_first_maximum():
  x = jnp.asarray([[1.0, 3.0, 3.0, -jnp.inf], [0.0, 0.0, 0.0, 0.0], [-1.0, -5.0, 2.0, 2.0]])
  np.testing.assert_array_equal(np.asarray(sampling.argmax(x)), [1, 0, 2])


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_k=-2), dict(top_p=0.0),
                                 dict(top_p=1.5)])
def test_invalid_settings_are_config_errors(bad):
  with pytest.raises(ConfigError, match="invalid sampling settings"):
    sampling.SamplingConfig(**bad)
