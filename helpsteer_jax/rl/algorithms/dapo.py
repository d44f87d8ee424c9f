"""DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
Scale"; verl's `recipe/dapo`): GRPO's group advantages with the paper's four changes:
clip-higher (eps 0.2 / 0.28), the token-level loss (every token of the step weighs
the same: `token`, TRL's `loss_type="dapo"`), no KL term, and on the rollout side
dynamic sampling (groups whose rewards are all equal replaced by further prompts'
groups, `rl.dynamic_sampling`; up to verl's `max_num_gen_batches` 10 extra rounds)
and the overlong reward shaping of Eq. 13 over the last fifth of the length limit
(the paper's 4096 of 20480 tokens); `filter_truncated` keeps the completions cut at
the limit out of the loss (the paper's overlong filtering, its other remedy)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from helpsteer_jax.rl.algorithms.base import Algorithm
from helpsteer_jax.rl.algorithms.grpo import GRPO

BUFFER_SHARE = 5  # the overlong buffer is 1/BUFFER_SHARE of rollout.max_new_tokens by default


@dataclasses.dataclass(frozen=True)
class DAPO(GRPO):
  name: ClassVar[str] = "dapo"
  default_aggregation: ClassVar[str] = "token"
  default_clip: ClassVar[tuple[float, float]] = (0.2, 0.28)

  beta: float = 0.0
  overlong_buffer: int = -1           # -1: a fifth of rollout.max_new_tokens
  dynamic_sampling_rounds: int = 10

  def resolved(self, max_new_tokens: int) -> Algorithm:
    if self.overlong_buffer >= 0:
      return self
    return dataclasses.replace(self, overlong_buffer=max_new_tokens // BUFFER_SHARE)
