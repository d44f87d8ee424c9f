"""GRPO (Shao et al. 2024; TRL's GRPOTrainer): group-relative advantages (over the
group's std unless `scale_advantages` is off: Dr. GRPO), and `beta` times the k3 KL
to the reference per token in the loss."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from helpsteer_jax.losses import advantages as adv_lib
from helpsteer_jax.losses import policy_gradient
from helpsteer_jax.rl.algorithms.base import Algorithm, LossSettings, per_token


@dataclasses.dataclass(frozen=True)
class GRPO(Algorithm):
  name: ClassVar[str] = "grpo"
  min_samples: ClassVar[int] = 2
  default_aggregation: ClassVar[str] = "sequence"  # each completion's tokens averaged

  beta: float = 0.04             # k3 KL to the reference per token, in the loss
  scale_advantages: bool = True  # divide by the group's std (False: Dr. GRPO)

  def problems(self) -> list[str]:
    return [f"loss.beta={self.beta} must be >= 0"] if self.beta < 0 else []

  @property
  def uses_reference(self) -> bool:
    return self.beta > 0

  def advantages(self, rows: dict[str, np.ndarray], scores: np.ndarray, k: int,
                 logp: np.ndarray, ref_logp: np.ndarray, critic: Any = None) -> np.ndarray:
    adv = adv_lib.grpo_advantages(jnp.asarray(scores, jnp.float32), k, self.scale_advantages)
    return per_token(adv, rows["mask"])

  def loss_sums(self, logp: jax.Array, old_logp: jax.Array, batch: Any,
                common: LossSettings) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    return policy_gradient.policy_loss_sums(
        logp, old_logp, batch.ref_logp if self.beta else None, batch.advantages, batch.mask,
        beta=self.beta, eps_low=common.eps_low, eps_high=common.eps_high,
        aggregation=common.aggregation, max_tokens=common.max_tokens,
        importance_level=self.importance_level, sampler_weights=common.sampler_weights(batch))
