"""A local generative judge's token budget, and the refusal of one that cannot work.

A judge on the mesh reads its prompt and writes up to `scorer.judge_max_new_tokens` (a
GenRM's answer, a principle judge's reasoning; none for a one-pass principle judge) in
rows of `scorer.max_len` tokens, so its prompt has `Budget.prompt` = max_len -
judge_max_new_tokens. A prompt over it is not judged: its conversations are unscored
(NaN). A budget under which nothing can be judged is refused before anything compiles,
naming what to set:

- where the judge is built (`scoring.load.judge_model`, every task and the server): the
  judge's prompt with no conversation in it, its fixed text alone, has to fit;
- where a task first has its own prompts (`fitting`: evaluate_rm's sets, RL's prompts,
  best-of-n's requests): at least one has to fit, and the task learns which do.

A judge behind a URL has no budget here: `scorer.max_len` is not what that server
allows, and a prompt too long for it is refused by the server with an error that stops
the run (the judge client's), not skipped.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

import numpy as np
from absl import logging

from helpsteer_jax.data.records import Conversation
from helpsteer_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Budget:
  """A judge's rows of `max_len` tokens, `new_tokens` of them kept for what it writes
  (`least_new`: the fewest it can do with, 1 for a GenRM's answer, 0 for a principle
  judge, which then judges in one pass)."""

  max_len: int
  new_tokens: int
  least_new: int = 0

  @property
  def prompt(self) -> int:
    """The tokens a judge prompt may have."""
    return self.max_len - self.new_tokens

  def refusal(self, shortest: int, what: str) -> ConfigError:
    """The error for a budget that `what` (the shortest of them `shortest` tokens) does
    not fit, with the settings that would make it fit."""
    fix = f"raise scorer.max_len to at least {shortest + self.new_tokens}"
    if self.max_len - shortest >= self.least_new and self.new_tokens > self.least_new:
      fix += f" or lower scorer.judge_max_new_tokens to at most {self.max_len - shortest}"
    return ConfigError(
        f"the judge's token budget fits no {what}: scorer.max_len={self.max_len} -"
        f" scorer.judge_max_new_tokens={self.new_tokens} leaves {self.prompt} tokens for a"
        f" judge prompt, and the shortest is {shortest} tokens: {fix}")

  def check(self, tokens: int, what: str) -> None:
    """ConfigError unless a prompt of `tokens` fits."""
    if tokens > self.prompt:
      raise self.refusal(tokens, what)


class BudgetedJudge(Protocol):
  """A local judge: its budget and the tokens of the prompts it would judge a group with."""

  budget: Budget | None

  def prompt_tokens(self, group: Sequence[Conversation]) -> np.ndarray:
    """[len(group)] the tokens of the shortest prompt that judges each conversation of
    `group` (conversations answering one context, as the judge is called with them)."""


def fitting(scorer, groups: Sequence[Sequence[Conversation]], what: str) -> np.ndarray:
  """[len(groups)] whether every conversation of each group has a judge prompt within the
  budget of `scorer`'s local judge (all True for a scorer without one); ConfigError when
  no group does, a warning with the count when some do not."""
  budget = getattr(scorer, "budget", None)
  if budget is None or not groups:
    return np.ones(len(groups), bool)
  longest = np.asarray([np.max(scorer.prompt_tokens(g)) for g in groups])
  fits = longest <= budget.prompt
  if not fits.any():
    raise budget.refusal(int(longest.min()), what)
  if not fits.all():
    logging.warning("judge: %d of %d %ss have judge prompts over %d tokens (scorer.max_len=%d"
                    " - scorer.judge_max_new_tokens=%d): they cannot be judged",
                    int((~fits).sum()), len(fits), what, budget.prompt, budget.max_len,
                    budget.new_tokens)
  return fits
