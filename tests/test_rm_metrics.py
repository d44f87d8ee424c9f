"""Reward-model metrics against scipy / NumPy and RewardBench's section weighting."""

import numpy as np
import pytest
from scipy import stats

from helpsteer_jax import config_sections
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.scoring import metrics as rm_metrics
from helpsteer_jax.scoring import rewards

M = -100.0


def test_attribute_metrics_match_scipy_and_numpy():
  rng = np.random.RandomState(0)
  n = 50
  labels = np.full((n, 9), M)
  labels[:, 4:] = rng.randint(0, 5, (n, 5))
  labels[::7, 6] = M  # some coherence labels missing
  preds = labels + rng.normal(0, 0.8, labels.shape)
  preds[:, 4] = rng.uniform(-1, 5.6, n)  # beyond the range: clipped before rounding
  out = rm_metrics.attribute_metrics(preds, labels)
  assert list(out) == list(ATTRIBUTES[4:])
  for j, name in enumerate(ATTRIBUTES):
    if j < 4:
      continue
    keep = labels[:, j] != M
    p, t = preds[keep, j], labels[keep, j]
    assert out[name]["count"] == keep.sum()
    np.testing.assert_allclose(out[name]["mse"], np.mean((p - t) ** 2), rtol=1e-12)
    np.testing.assert_allclose(out[name]["mae"], np.mean(np.abs(p - t)), rtol=1e-12)
    np.testing.assert_allclose(out[name]["pearson"], stats.pearsonr(p, t)[0], rtol=1e-10)
    acc = np.mean([min(max(round(float(x)), 0), 4) == y for x, y in zip(p, t)])
    np.testing.assert_allclose(out[name]["accuracy"], acc)
  assert out["coherence"]["count"] == n - len(range(0, n, 7))


def test_pearson_of_a_constant_is_nan():
  assert np.isnan(rm_metrics.pearson(np.ones(5), np.arange(5)))


def test_rounding_clips_to_the_score_range():
  np.testing.assert_array_equal(rm_metrics.rounded(np.asarray([-0.7, 0.49, 2.5, 3.51, 9.0])),
                                [0, 0, 2, 4, 4])


def test_rewards_are_the_weighted_sum_with_the_steerlm_rm_weights():
  preds = np.arange(18, dtype=np.float64).reshape(2, 9)
  w = rewards.weight_vector(config_sections.HELPSTEER2_WEIGHTS)
  np.testing.assert_allclose(w, [0, 0, 0, 0, 0.65, 0.8, 0.45, 0.55, -0.4])
  np.testing.assert_allclose(rewards.rewards(preds, w), preds @ w)
  np.testing.assert_allclose(rewards.rewards(preds, config_sections.HELPSTEER2_WEIGHTS), preds @ w)
  assert w.tolist() == [0, 0, 0, 0, 0.65, 0.8, 0.45, 0.55, -0.4]


def test_pairwise_accuracy_is_strict_and_per_subset():
  r_c = np.asarray([1.0, 2.0, 0.5, 3.0, 1.0])
  r_r = np.asarray([0.0, 2.0, 0.7, 1.0, 0.0])
  assert rm_metrics.pairwise_accuracy(r_c, r_r) == pytest.approx(3 / 5)  # a tie is wrong
  by = rm_metrics.accuracy_by_subset(r_c, r_r, ["a", "a", "b", "b", "b"])
  assert by == {"a": {"count": 2, "ties": 1, "accuracy": 0.5},
                "b": {"count": 3, "ties": 0, "accuracy": 2 / 3}}


def test_rewardbench_sections_weight_subsets_like_rewardbench():
  by = {"alpacaeval-easy": {"accuracy": 1.0}, "mt-bench-easy": {"accuracy": 0.0},
        "math-prm": {"accuracy": 0.5}, "hep-python": {"accuracy": 1.0},
        "hep-go": {"accuracy": 0.0}, "unknown-subset": {"accuracy": 1.0}}
  out = rm_metrics.rewardbench_sections(by)
  # Chat: (100 * 1 + 28 * 0) / 128; Reasoning: math-prm counts as 984 rows.
  assert out["Chat"] == pytest.approx(100 / 128)
  assert out["Reasoning"] == pytest.approx((984 * 0.5 + 164 * 1.0) / (984 + 164 * 2))
  assert "Safety" not in out and "Chat Hard" not in out
  assert out["Score"] == pytest.approx((out["Chat"] + out["Reasoning"]) / 2)
