"""On-policy distillation: a teacher scores the student's own rollouts token by token.

The loss is the per-token reverse KL(student || teacher) over the whole vocabulary
(`losses.distillation`) at each completion token of the student's samples: TRL's GKD
with lmbda=1 (every sequence the student's) and beta=1 (`trl/trainer/gkd_trainer.py`,
`generalized_jsd_loss`, its "batchmean" the mean over completion tokens: the "token"
aggregation), NeMo-RL's `DistillationLossFn` with `kl_type="reverse"`
(`nemo_rl/algorithms/loss_functions.py`, there over the teacher's top-k logits).

`reward_coef` > 0 adds GRPO's clipped policy-gradient term on the attribute-model
reward's group advantages (`scale_advantages` as GRPO's), aggregated like the KL:
loss = agg(KL_t) + reward_coef * agg(clipped surrogate_t). With 0 the scorer still
scores, for the metrics. The teacher (`rl.teacher`) runs inside the loss.
"""

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
class Distill(Algorithm):
  name: ClassVar[str] = "distill"
  needs_teacher: ClassVar[bool] = True
  default_aggregation: ClassVar[str] = "token"  # TRL's batchmean: over completion tokens
  token_metrics: ClassVar[tuple[str, ...]] = ("teacher_kl",)

  reward_coef: float = 0.0       # the GRPO term on the reward's advantages (0: pure KD)
  scale_advantages: bool = True  # the reward term's group advantages over the group's std

  @property
  def min_samples(self) -> int:
    return 2 if self.reward_coef else 1

  def problems(self) -> list[str]:
    return [f"loss.reward_coef={self.reward_coef} must be >= 0"] if self.reward_coef < 0 else []

  def advantages(self, rows: dict[str, np.ndarray], scores: np.ndarray, k: int,
                 logp: np.ndarray, ref_logp: np.ndarray, critic: Any = None) -> np.ndarray:
    if not self.reward_coef:
      return np.zeros_like(rows["mask"], np.float32)
    adv = adv_lib.grpo_advantages(jnp.asarray(scores, jnp.float32), k, self.scale_advantages)
    return per_token(adv, rows["mask"])

  def loss_sums(self, logp: jax.Array, old_logp: jax.Array, batch: Any,
                common: LossSettings, teacher_kl: jax.Array | None = None
                ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """`teacher_kl` [B, T]: the per-token reverse KL to the teacher (the loss's own term;
    `logp` is read only by the reward's term)."""
    if teacher_kl is None:
      raise ValueError("distillation's loss needs the per-token KL to the teacher")
    mask = batch.mask
    total, weight = policy_gradient.aggregate_sum(teacher_kl, mask, common.aggregation,
                                                  common.max_tokens)
    sums = {"tokens": mask.sum(), "teacher_kl": (teacher_kl * mask).sum(),
            "clipped": jnp.zeros((), jnp.float32)}
    if self.reward_coef:
      pg, _, pg_sums = policy_gradient.policy_loss_sums(
          logp, old_logp, None, batch.advantages, mask, beta=0.0, eps_low=common.eps_low,
          eps_high=common.eps_high, aggregation=common.aggregation,
          max_tokens=common.max_tokens, importance_level=self.importance_level)
      total = total + self.reward_coef * pg
      sums["clipped"] = pg_sums["clipped"]
    return total, weight, sums
