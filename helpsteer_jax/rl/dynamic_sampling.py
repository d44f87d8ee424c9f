"""DAPO's dynamic sampling (Yu et al. 2025, section 3.2; verl's `filter_groups`): a
group whose K rewards are all equal has zero advantage and teaches nothing, so it is
dropped and replaced by the groups of further prompts, sampled in extra rounds until
the iteration's P groups are full or `rounds` extra rounds have run.

Round 0 is the iteration's own P prompts (`rollout.prompt_schedule`); round r >= 1
answers P further prompts, in a (seed, iteration, r) order of the prompts that the
iteration has not answered yet, with the completion seeds of the positions r * P + i,
so every process and a resumed iteration draw the same rounds. The batch keeps the
surviving groups in the order they were sampled; when the rounds run out, the
dropped groups fill the remaining places (their advantage is 0, so they add nothing
to the gradient, and the compiled step keeps its shape), and the metrics say how
many (`dynamic_filled`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from helpsteer_jax.rl.rollout import Rollouts


@dataclasses.dataclass
class Round:
  """One round's P' groups: their prompt indices, rollouts [P' * K], the scorer's
  predictions [P' * K, 9], the rewards [P' * K] and the scores the groups are judged
  on [P' * K] (the rewards with the length terms, before an algorithm's KL term)."""

  prompts: list[int]
  rollouts: Rollouts
  preds: np.ndarray
  rewards: np.ndarray
  scores: np.ndarray


def equal_groups(scores: np.ndarray, k: int) -> np.ndarray:
  """[P] whether each group's K scores are all exactly equal ([P * K] prompt-major)."""
  g = np.asarray(scores).reshape(-1, k)
  return g.max(axis=1) == g.min(axis=1)


def further_prompts(n: int, per_round: int, seed: int, iteration: int, round_: int,
                    used: set[int]) -> list[int]:
  """Up to `per_round` of the `n` prompts not in `used`, in the (seed, iteration, round)
  order."""
  order = np.random.default_rng([seed, iteration, round_]).permutation(n)
  return [int(i) for i in order if int(i) not in used][:per_round]


def pick(kept: Sequence[np.ndarray], p: int) -> tuple[list[tuple[int, int]], int]:
  """The (round, group) pairs of the batch: the first `p` groups whose scores differ,
  in sampling order, then dropped groups for the places left; and how many of those."""
  good = [(r, g) for r, keep in enumerate(kept) for g in np.flatnonzero(keep)]
  bad = [(r, g) for r, keep in enumerate(kept) for g in np.flatnonzero(~keep)]
  chosen = good[:p]
  filled = max(p - len(chosen), 0)
  return [(r, int(g)) for r, g in chosen + bad[:filled]], filled


def take(rounds: Sequence[Round], picks: Sequence[tuple[int, int]], k: int) -> Round:
  """The picked groups as one round."""
  rows = [(r, g * k + j) for r, g in picks for j in range(k)]

  def stack(field: str) -> np.ndarray:
    return np.stack([getattr(rounds[r].rollouts, field)[i] for r, i in rows])

  rollouts = Rollouts([rounds[r].rollouts.prompts[g] for r, g in picks], k,
                      stack("tokens"), stack("mask"), stack("sampler_logp"),
                      stack("finished"), [rounds[r].rollouts.texts[i] for r, i in rows],
                      None if rounds[0].rollouts.answers is None
                      else [rounds[r].rollouts.answers[i] for r, i in rows])
  def column(field: str) -> np.ndarray:
    return np.stack([getattr(rounds[r], field)[i] for r, i in rows])

  return Round([rounds[r].prompts[g] for r, g in picks], rollouts, column("preds"),
               column("rewards"), column("scores"))


def collect(sample_round: Callable[[int, list[int]], Round], first: list[int], n: int,
            k: int, extra_rounds: int, seed: int, iteration: int
            ) -> tuple[Round, dict[str, float]]:
  """Rounds of `sample_round(round, prompt indices)` from the iteration's prompts
  `first` until P = len(first) groups with unequal scores are in hand or
  `extra_rounds` extra rounds have run; the batch (`take`) and its metrics."""
  p = len(first)
  rounds = [sample_round(0, list(first))]
  kept = [~equal_groups(rounds[0].scores, k)]
  used = set(first)
  while sum(int(x.sum()) for x in kept) < p and len(rounds) <= extra_rounds:
    more = further_prompts(n, p, seed, iteration, len(rounds), used)
    if not more:
      break
    used.update(more)
    rounds.append(sample_round(len(rounds), more))
    kept.append(~equal_groups(rounds[-1].scores, k))
  picks, filled = pick(kept, p)
  sampled = sum(len(x) for x in kept)
  metrics = {"dynamic_rounds": float(len(rounds) - 1),
             "dynamic_drop_rate": float(sum(int((~x).sum()) for x in kept) / sampled),
             "dynamic_filled": float(filled)}
  return take(rounds, picks, k), metrics
