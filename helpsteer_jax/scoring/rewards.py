"""The scalar reward of attribute predictions: a weighted sum of the nine attributes."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError


def weight_vector(weights: Mapping[str, float] | Sequence[float]) -> np.ndarray:
  """[9] float64 weights in `ATTRIBUTES` order from name -> weight (missing names weigh 0)
  or from nine numbers."""
  if not isinstance(weights, Mapping):
    vector = np.asarray(weights, np.float64).reshape(-1)
    if vector.shape != (len(ATTRIBUTES),):
      raise ConfigError(f"reward weights: {len(vector)} values; give one per attribute"
                        f" ({', '.join(ATTRIBUTES)})")
    return vector
  unknown = sorted(set(weights) - set(ATTRIBUTES))
  if unknown:
    raise ConfigError(f"reward weights name unknown attribute(s) {unknown}; known:"
                      f" {', '.join(ATTRIBUTES)}")
  return np.asarray([float(weights.get(name, 0.0)) for name in ATTRIBUTES], np.float64)


def rewards(preds: np.ndarray, weights: Mapping[str, float] | Sequence[float]) -> np.ndarray:
  """[n] float64 rewards of [n, 9] predictions (a row with NaN gives NaN)."""
  return np.asarray(preds, np.float64) @ weight_vector(weights)
