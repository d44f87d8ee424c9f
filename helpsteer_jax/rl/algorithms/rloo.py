"""REINFORCE with a leave-one-out baseline (HelpSteer2-Preference's recipe; TRL's
RLOOTrainer): the KL to the reference folded into each completion's reward, the
advantage its reward minus the mean of the other samples of its prompt."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from helpsteer_jax.losses import advantages as adv_lib
from helpsteer_jax.rl.algorithms.base import Algorithm, per_token


@dataclasses.dataclass(frozen=True)
class RLOO(Algorithm):
  name: ClassVar[str] = "rloo"
  min_samples: ClassVar[int] = 2
  default_aggregation: ClassVar[str] = "token"

  kl_coef: float = 0.05               # the sequence-level KL in the reward
  normalize_advantages: bool = False  # whiten over the batch

  def problems(self) -> list[str]:
    return [f"loss.kl_coef={self.kl_coef} must be >= 0"] if self.kl_coef < 0 else []

  @property
  def uses_reference(self) -> bool:
    return self.kl_coef > 0

  def shape_scores(self, scores, logp, ref_logp, mask):
    if not self.kl_coef:
      return scores
    return np.asarray(adv_lib.with_kl_penalty(scores, logp, ref_logp, mask, self.kl_coef))

  def advantages(self, rows: dict[str, np.ndarray], scores: np.ndarray, k: int,
                 logp: np.ndarray, ref_logp: np.ndarray, critic: Any = None) -> np.ndarray:
    adv = adv_lib.rloo_advantages(jnp.asarray(scores, jnp.float32), k,
                                  self.normalize_advantages)
    return per_token(adv, rows["mask"])
