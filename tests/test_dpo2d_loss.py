"""2D-DPO, DPO and IPO losses against independent NumPy re-derivations.

References: Li et al., "2D-DPO: Scaling Direct Preference Optimization with
2-Dimensional Supervision" (NAACL Findings 2025), Eq. 5 and Eq. 6; TRL's
DPOTrainer.dpo_loss for `sigmoid` (with label smoothing) and `ipo`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpsteer_jax.losses import dpo, dpo2d

BETA = 0.3


def _logsig(x):
  return -np.logaddexp(0.0, -x)


def _random_pairs(seed, b=6, s=7, a=5):
  """Several segments, unequal counts, scores on a 0..4 grid (many ties)."""
  rng = np.random.RandomState(seed)
  counts = rng.randint(1, s + 1, size=(b, 2))
  counts[0] = (s, min(2, s))
  counts[-1] = (1, s)
  mask = np.arange(s)[None, None, :] < counts[..., None]
  scores = rng.randint(0, 5, size=(b, 2, s, a)) / 4.0
  policy = rng.normal(-20, 5, size=(b, 2, s))
  reference = policy + rng.normal(0, 1.0, size=(b, 2, s))
  lengths = rng.randint(5, 50, size=(b, 2)).astype(np.float64)
  weights = rng.dirichlet(np.ones(a))
  return dict(policy=policy, reference=reference, scores=scores, mask=mask, lengths=lengths,
              pair_weight=np.ones(b)), weights


def _inputs(d):
  return dpo2d.PairInputs(**{k: jnp.asarray(v, jnp.float32 if v.dtype != bool else bool)
                             for k, v in d.items()})


def _segments(d, weights, i, side, one_d=False):
  """[(r_k, lr_k)] of the valid segments of pair i, in segment order."""
  out = []
  for k in range(d["mask"].shape[2]):
    if d["mask"][i, side, k]:
      s = d["scores"][i, side, k]
      r = float(np.mean(s)) if one_d else float(sum(wa * sa for wa, sa in zip(weights, s)))
      out.append((r, d["policy"][i, side, k] - d["reference"][i, side, k]))
  return out


def _np_eq5(d, weights, one_d=False):
  losses = []
  for i in range(d["mask"].shape[0]):
    won = sum(r * lr for r, lr in _segments(d, weights, i, 0, one_d))
    lost = sum(r * lr for r, lr in _segments(d, weights, i, 1, one_d))
    losses.append(-_logsig(BETA * won - BETA * lost))
  return np.array(losses)


def _np_eq6(d, weights, one_d=False):
  losses = []
  for i in range(d["mask"].shape[0]):
    won = _segments(d, weights, i, 0, one_d)
    lost = _segments(d, weights, i, 1, one_d)
    n = min(len(won), len(lost))
    # Python's sort is stable: equal r keep segment order.
    w_sorted = sorted(won, key=lambda t: -t[0])[:n]
    l_sorted = sorted(lost, key=lambda t: t[0])[:n]
    losses.append(-sum(_logsig(BETA * rw * lw - BETA * rl * ll)
                       for (rw, lw), (rl, ll) in zip(w_sorted, l_sorted)))
  return np.array(losses)


def _loss(d, weights, **kw):
  cfg = dpo2d.PreferenceLossConfig(beta=BETA, aspect_weights=tuple(weights), **kw)
  loss, metrics = jax.jit(dpo2d.pair_losses, static_argnums=1)(_inputs(d), cfg)
  return np.asarray(loss), {k: np.asarray(v) for k, v in metrics.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_eq6_grouped_matches_numpy(seed):
  d, w = _random_pairs(seed)
  loss, _ = _loss(d, w, loss_type="dpo2d", grouped=True)
  np.testing.assert_allclose(loss, _np_eq6(d, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_eq5_ungrouped_matches_numpy(seed):
  d, w = _random_pairs(seed)
  loss, metrics = _loss(d, w, loss_type="dpo2d", grouped=False)
  np.testing.assert_allclose(loss, _np_eq5(d, w), rtol=1e-5, atol=1e-5)
  # The per-aspect weighted margins add up to the Eq. 5 margin.
  aspect_sum = sum(metrics[f"margin_{a}"] for a in dpo2d.PreferenceLossConfig().aspects)
  np.testing.assert_allclose(aspect_sum, metrics["margin_2d"], rtol=1e-5, atol=1e-4)


def test_ties_keep_segment_order():
  """All chosen segments tie: Eq. 6 must take the first N in segment order."""
  d, w = _random_pairs(3, b=1, s=4)
  d["mask"][:] = [[True] * 4, [True, True, False, False]]
  d["scores"][:] = 0.5
  d["policy"][0, 0] = [-1.0, -2.0, -3.0, -4.0]
  d["reference"][0, 0] = 0.0
  loss, _ = _loss(d, w, loss_type="dpo2d")
  np.testing.assert_allclose(loss, _np_eq6(d, w), rtol=1e-6)
  order = dpo2d.grouped_order(jnp.full((1, 4), 0.5), jnp.ones((1, 4), bool), descending=True)
  np.testing.assert_array_equal(order, [[0, 1, 2, 3]])
  order = dpo2d.grouped_order(jnp.asarray([[0.0, 0.3, 0.0, 0.3]]),
                              jnp.asarray([[True, True, False, True]]), descending=True)
  np.testing.assert_array_equal(order, [[1, 3, 0, 2]])


def test_one_d_baselines_match_numpy():
  d, w = _random_pairs(4)
  loss, _ = _loss(d, w, loss_type="dpo1d_segment", grouped=True)
  np.testing.assert_allclose(loss, _np_eq6(d, w, one_d=True), rtol=1e-5, atol=1e-5)
  loss, _ = _loss(d, w, loss_type="dpo1d_segment", grouped=False)
  np.testing.assert_allclose(loss, _np_eq5(d, w, one_d=True), rtol=1e-5, atol=1e-5)
  # dpo1d_aspect: one segment per response scored by the response's mean segment scores.
  loss, _ = _loss(d, w, loss_type="dpo1d_aspect")
  expected = []
  for i in range(d["mask"].shape[0]):
    margin = 0.0
    for side, sign in ((0, 1.0), (1, -1.0)):
      m = d["mask"][i, side]
      resp_scores = d["scores"][i, side][m].mean(0)
      lr = (d["policy"][i, side] - d["reference"][i, side])[m].sum()
      margin += sign * BETA * float(resp_scores @ w) * lr
    expected.append(-_logsig(margin))
  np.testing.assert_allclose(loss, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("grouped", [True, False])
def test_reduces_to_dpo_with_one_segment_of_weight_one(grouped):
  d, w = _random_pairs(5, s=1, a=1)
  d["scores"][:] = 1.0
  loss_2d, _ = _loss(d, np.ones(1), loss_type="dpo2d", grouped=grouped, aspects=("a",))
  loss_dpo, _ = _loss(d, np.ones(1), loss_type="dpo", aspects=("a",))
  np.testing.assert_allclose(loss_2d, loss_dpo, rtol=1e-6)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_dpo_matches_trl_sigmoid(label_smoothing):
  d, w = _random_pairs(6)
  loss, metrics = _loss(d, w, loss_type="dpo", label_smoothing=label_smoothing)
  # TRL: logits = (pi_c - pi_r) - (ref_c - ref_r);
  # losses = -logsigmoid(beta*logits)*(1-ls) - logsigmoid(-beta*logits)*ls
  pc, pr = (np.where(d["mask"], d["policy"], 0).sum(-1)[:, j] for j in (0, 1))
  rc, rr = (np.where(d["mask"], d["reference"], 0).sum(-1)[:, j] for j in (0, 1))
  logits = (pc - pr) - (rc - rr)
  expected = (-_logsig(BETA * logits) * (1 - label_smoothing)
              - _logsig(-BETA * logits) * label_smoothing)
  np.testing.assert_allclose(loss, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(metrics["reward_chosen"], BETA * (pc - rc), rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(metrics["reward_rejected"], BETA * (pr - rr), rtol=1e-5, atol=1e-4)
  np.testing.assert_array_equal(metrics["reward_accuracy"], (pc - rc > pr - rr).astype(float))


def test_ipo_matches_trl():
  d, w = _random_pairs(7)
  loss, _ = _loss(d, w, loss_type="ipo")
  # TRL ipo: logps averaged over completion tokens, losses = (logits - 1/(2 beta))^2.
  lp = np.where(d["mask"], d["policy"], 0).sum(-1) / d["lengths"]
  lr = np.where(d["mask"], d["reference"], 0).sum(-1) / d["lengths"]
  logits = (lp[:, 0] - lp[:, 1]) - (lr[:, 0] - lr[:, 1])
  np.testing.assert_allclose(loss, (logits - 1 / (2 * BETA)) ** 2, rtol=1e-5, atol=1e-5)
  direct = dpo.ipo_loss(jnp.asarray(lp[:, 0] * d["lengths"][:, 0] - lr[:, 0] * d["lengths"][:, 0]),
                        jnp.asarray(lp[:, 1] * d["lengths"][:, 1] - lr[:, 1] * d["lengths"][:, 1]),
                        jnp.asarray(d["lengths"][:, 0]), jnp.asarray(d["lengths"][:, 1]), BETA)
  np.testing.assert_allclose(direct, (logits - 1 / (2 * BETA)) ** 2, rtol=1e-4, atol=1e-5)


def test_padding_pairs_contribute_nothing_and_gradients_are_finite():
  d, w = _random_pairs(8)
  d["pair_weight"][-2:] = 0.0
  d["mask"][-1] = False
  cfg = dpo2d.PreferenceLossConfig(beta=BETA, aspect_weights=tuple(w))
  x = _inputs(d)

  def total(policy):
    loss, _ = dpo2d.pair_losses(x._replace(policy=policy), cfg)
    return jnp.sum(loss)

  loss, metrics = dpo2d.pair_losses(x, cfg)
  assert float(loss[-1]) == 0.0 and float(loss[-2]) == 0.0
  g = jax.grad(total)(x.policy)
  assert np.all(np.isfinite(g))
  np.testing.assert_array_equal(g[-2:], 0.0)
  assert all(float(v[-1]) == 0.0 for v in metrics.values())
