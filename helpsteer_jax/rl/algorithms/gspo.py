"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"; TRL 1.9 GRPOTrainer's
`importance_sampling_level="sequence"`): GRPO's group advantages with one importance
ratio per completion, exp of the mean of its token log-ratios, clipped per completion;
`importance_level="sequence_token"` is GSPO-token (TRL's experimental gspo_token
trainer). The paper's defaults: clip range 3e-4 / 4e-4, no KL term, the loss averaged
per completion."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from helpsteer_jax.rl.algorithms.grpo import GRPO

LEVELS = ("sequence", "sequence_token")


@dataclasses.dataclass(frozen=True)
class GSPO(GRPO):
  name: ClassVar[str] = "gspo"
  default_aggregation: ClassVar[str] = "sequence"
  default_clip: ClassVar[tuple[float, float]] = (3e-4, 4e-4)

  beta: float = 0.0
  importance_level: str = "sequence"  # or "sequence_token" (GSPO-token)

  def problems(self) -> list[str]:
    out = super().problems()
    if self.importance_level not in LEVELS:
      out.append(f"loss.importance_level={self.importance_level!r}: choose one of"
                 f" {', '.join(LEVELS)}")
    return out
