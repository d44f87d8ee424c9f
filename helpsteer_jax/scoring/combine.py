"""The attribute model and a principle judge as one reward (`scorer.principle_source`).

The combined rows are the attribute model's [n, 9] predictions with `coef` times the
judge's reward added to the `REWARD_SLOT` (helpfulness) column, where a one-reward source
writes its reward: the weighted reward is then the attribute model's plus
`weights.helpfulness * coef` times the judge's, and every other consumer of the
predictions (the steering distance, the metrics) still reads the attribute model's. A
NaN from either scorer leaves that row's reward NaN. Both are `Scorer`s (the same rows
on every process), so the sum is too.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from helpsteer_jax.data.records import ATTRIBUTES, Conversation
from helpsteer_jax.scoring.scorer import REWARD_SLOT, Scorer, checked


class CombinedScorer:
  """`attribute(convs)` with `coef * judge(convs)`'s reward added to the reward column."""

  def __init__(self, attribute: Scorer, judge: Scorer, coef: float):
    self.attribute, self.judge, self.coef = attribute, judge, float(coef)

  @property
  def local_rows(self) -> int:
    return self.attribute.local_rows + self.judge.local_rows

  @property
  def budget(self):
    """The judge's (`judge_budget`: a task's prompts are checked against it)."""
    return getattr(self.judge, "budget", None)

  def prompt_tokens(self, group: Sequence[Conversation]) -> np.ndarray:
    return self.judge.prompt_tokens(group)

  def __call__(self, convs: Sequence[Conversation]) -> np.ndarray:
    out = checked(self.attribute(convs), len(convs)).copy()
    slot = ATTRIBUTES.index(REWARD_SLOT)
    out[:, slot] += np.float32(self.coef) * checked(self.judge(convs), len(convs))[:, slot]
    return out
