"""Regression (masked MSE) and Bradley-Terry losses against hand / NumPy references.

References: NeMo-Aligner's regression reward model loss
sum(mask * (pred - label)^2) / sum(mask) with mask = (label != -100), and the
HelpSteer2-Preference paper (Wang et al. 2024, eqs. 1-3):
regular -log s(r_c - r_r), margin -log s(r_c - r_r - m), scaled m * -log s(r_c - r_r).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from helpsteer_jax.data.records import CHOSEN, REJECTED
from helpsteer_jax.losses.bt import BT_VARIANTS, bt_loss, bt_pair_losses
from helpsteer_jax.losses.regression import masked_mse, masked_mse_sums, regression_loss

M = -100.0


def test_masked_mse_hand_computed():
  preds = np.zeros((2, 9), np.float32)
  preds[0, 4:] = [1.0, 2.0, 3.0, 0.5, 4.0]
  preds[1, 4:] = [2.0, 2.0, 2.0, 2.0, 2.0]
  labels = np.full((2, 9), M, np.float32)
  labels[0, 4:] = [2, M, 1, 0, 4]   # errors 1, -, 2, 0.5, 0
  labels[1, 4:] = [M, M, M, M, 0]   # error 2
  # (1 + 4 + 0.25 + 0 + 4) / 5 = 1.85
  total, count = masked_mse_sums(jnp.asarray(preds), jnp.asarray(labels))
  assert float(count) == 5.0
  np.testing.assert_allclose(float(total), 9.25, rtol=1e-6)
  np.testing.assert_allclose(float(masked_mse(jnp.asarray(preds), jnp.asarray(labels))), 1.85,
                             rtol=1e-6)


def test_masked_mse_ignores_huge_predictions_on_missing_labels():
  preds = jnp.asarray([[1e6, 3.0]])
  labels = jnp.asarray([[M, 1.0]])
  np.testing.assert_allclose(float(masked_mse(preds, labels)), 4.0)


class FixedModel:
  """Stands in for the reward model: returns given per-token outputs."""

  def __init__(self, out):
    self.out = jnp.asarray(out, jnp.float32)

  def __call__(self, tokens, positions, segment_ids):
    return self.out


def test_regression_loss_reads_only_the_marked_tokens_of_packed_rows():
  rng = np.random.RandomState(0)
  preds = rng.normal(size=(2, 6, 9)).astype(np.float32)
  labels = np.full((2, 6, 9), M, np.float32)
  readout = np.zeros((2, 6), np.float32)
  seg = np.asarray([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0]], np.int32)
  # Row 0 packs two sequences (ending at 1 and 4); row 1 has one (ending at 3).
  ends = [(0, 1), (0, 4), (1, 3)]
  for b, t in ends:
    readout[b, t] = 1.0
    labels[b, t, 4:] = rng.randint(0, 5, 5)
  labels[0, 4, 7] = M                      # one missing attribute
  labels[1, 5, 4:] = 3.0                   # padding: labelled but not a readout
  batch = {"inputs": np.zeros((2, 6), np.int32), "positions": np.zeros((2, 6), np.int32),
           "segment_ids": seg, "labels": labels, "readout": readout}
  total, aux = regression_loss(FixedModel(preds), batch)
  want_sq, want_abs, n = 0.0, 0.0, 0
  for b, t in ends:
    for j in range(4, 9):
      if labels[b, t, j] != M:
        want_sq += (preds[b, t, j] - labels[b, t, j]) ** 2
        want_abs += abs(preds[b, t, j] - labels[b, t, j])
        n += 1
  assert float(aux["weight"]) == n == 14
  np.testing.assert_allclose(float(total), want_sq, rtol=1e-5)
  np.testing.assert_allclose(float(aux["mae"]), want_abs, rtol=1e-5)


def _np_log_sigmoid(x):
  return -np.logaddexp(0.0, -x)


@pytest.mark.parametrize("variant", BT_VARIANTS)
def test_bt_variants_match_their_formulas(variant):
  rng = np.random.RandomState(1)
  r_c, r_r = rng.normal(0, 3, 64), rng.normal(0, 3, 64)
  m = rng.randint(1, 4, 64).astype(np.float64)
  d = r_c - r_r
  want = {"regular_bt": -_np_log_sigmoid(d),
          "margin_bt": -_np_log_sigmoid(d - m),
          "scaled_bt": m * -_np_log_sigmoid(d)}[variant]
  got = bt_pair_losses(jnp.asarray(r_c, jnp.float32), jnp.asarray(r_r, jnp.float32),
                       jnp.asarray(m, jnp.float32), variant)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_bt_variants_differ_and_reject_unknown():
  one = jnp.asarray([0.5])
  vals = {v: float(bt_pair_losses(one, jnp.asarray([0.0]), jnp.asarray([2.0]), v)[0])
          for v in BT_VARIANTS}
  assert len(set(vals.values())) == 3
  with pytest.raises(ValueError, match="regular_bt"):
    bt_pair_losses(one, one, one, "hinge")


def test_bt_loss_pairs_chosen_and_rejected_in_each_row():
  rng = np.random.RandomState(2)
  out = rng.normal(size=(3, 8, 9)).astype(np.float32)
  pair = np.zeros((3, 8), np.int32)
  margin = np.zeros((3, 8), np.float32)
  pair[0, 2], pair[0, 6], margin[0, 2] = CHOSEN, REJECTED, 3
  pair[1, 4], pair[1, 7], margin[1, 4] = CHOSEN, REJECTED, 1
  # row 2: an empty padding row (no pair)
  batch = {"inputs": np.zeros((3, 8), np.int32), "positions": np.zeros((3, 8), np.int32),
           "segment_ids": np.ones((3, 8), np.int32), "pair": pair, "margin": margin}
  total, aux = bt_loss(FixedModel(out), batch, variant="scaled_bt", attribute="correctness")
  h = out[..., 5]  # correctness slot
  d = np.asarray([h[0, 2] - h[0, 6], h[1, 4] - h[1, 7]])
  want = np.sum(np.asarray([3.0, 1.0]) * -_np_log_sigmoid(d))
  np.testing.assert_allclose(float(total), want, rtol=1e-5)
  assert float(aux["weight"]) == 2.0
  assert float(aux["accuracy"]) == float(np.sum(d > 0))
