"""Masked MSE of the regression reward model (NeMo-Aligner's regression RM).

Missing attributes carry the label -100 and are excluded:
loss = sum(mask * (pred - label)^2) / sum(mask), mask = (label != -100).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from helpsteer_jax.data.batches import REGRESSION_BATCH
from helpsteer_jax.data.records import IGNORE_LABEL


def masked_mse_sums(preds: jax.Array, labels: jax.Array,
                    where: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(sum of masked squared errors, number of labels counted), both fp32.

  `where` (broadcastable to labels) further restricts the mask, e.g. to the
  positions where a sequence ends.
  """
  mask = (labels != IGNORE_LABEL).astype(jnp.float32)
  if where is not None:
    mask = mask * where
  err = preds.astype(jnp.float32) - jnp.where(mask > 0, labels, 0.0).astype(jnp.float32)
  return jnp.sum(mask * err * err), jnp.sum(mask)


def masked_mse(preds: jax.Array, labels: jax.Array) -> jax.Array:
  """sum(mask * (pred - label)^2) / sum(mask)."""
  total, count = masked_mse_sums(preds, labels)
  return total / jnp.maximum(count, 1.0)


def regression_loss(model: nnx.Module, batch: dict[str, jax.Array]):
  """Summed squared error over the labels of a micro-batch; `weight` = label count.

  `batch["labels"]` is [B, T, 9] and `batch["readout"]` [B, T] marks the last
  token of each (packed) sequence, where the head is read. The loop divides
  by the label count of the whole global batch, i.e. the issue's formula.
  """
  b = REGRESSION_BATCH.view(batch)
  preds = model(b.inputs, b.positions, b.segment_ids)
  with jax.named_scope("regression_loss"):
    readout = (b.readout * (b.segment_ids > 0))[..., None]
    total, count = masked_mse_sums(preds, b.labels, readout)
    mask = (b.labels != IGNORE_LABEL) * readout
    abs_err = jnp.sum(mask * jnp.abs(preds - b.labels))
    return total, {"weight": count, "mae": abs_err}
