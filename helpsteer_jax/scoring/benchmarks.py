"""The reward-model benchmarks, scored for any scorer: RM-Bench, JudgeBench, RewardBench 2.

The reward of a response is the scorer's predictions . weights (`rewards`), as for
evaluate_rm's pairwise accuracy. Each row's responses are scored as one group of
conversations answering its prompt (`scorer.predict_groups`), so that a pairwise judge
compares a row's responses with each other. Accuracies are fractions (the references
print percentages).

- RM-Bench (THU-KEG/RM-Bench, `scripts/utils.py` `compute_accuracy`): per domain the 3x3
  matrix M[i][j] = mean over rows of [r(chosen_i) > r(rejected_j)] (styles: concise,
  detailed plain, detailed markdown; a tie is wrong); hard = the mean of the upper
  triangle (i < j), normal = of the diagonal, easy = of the lower triangle; a domain's
  average = mean(hard, normal, easy). hard, normal and easy overall are the means over
  the domains, and overall = the mean of the domain averages (chat, code, math, safety).
- JudgeBench (ScalerLab/JudgeBench, `utils/metrics.py` `compute_final_metrics` with
  `reverse_order`): each pair judged as [A, B] and again as [B, A]. A judgement is "A>B"
  or "B>A" by the rewards of the group (JudgeBench's reward-model judges), "A=B" when
  equal, none when not scored; the swapped one is flipped back. Each decision that
  equals the label counts +1, each that equals the opposite -1; the pair is correct when
  the sum is positive. So an inconsistent pair, and a pair judged a tie in both orders,
  is wrong, and one tie with one right decision is right. Accuracy = correct / pairs,
  per category (the source's prefix, as `run_judge.py`) and over all pairs.
- RewardBench 2 (allenai/reward-bench, `rewardbench/utils.py`): best-of-n on a row's
  completions (chosen first): the first completion scores 1 / (the number at the
  maximum) when its reward is the maximum, else 0 (`reroll_and_score_dataset`); a
  subset's score is the mean. The Ties subset has its own (`process_single_model`):
  per prompt (ref and tied rows apart) accurate = worst correct > best incorrect; over
  the prompts with both a ref and a tied row, preferred = [tied's correct-incorrect
  margin > tied's spread of correct rewards], hard = the same with the smaller of the
  ref's and the tied's margins, margin = mean tanh(smaller margin / spread - 1) (NaN as
  0); score = 0.3 tied accuracy + 0.3 ref accuracy + 0.2 preferred + 0.2 hard + 0.01
  margin. Overall = the unweighted mean of the subsets' scores (the leaderboard's).

A row (RM-Bench, RewardBench 2) with a response not scored is dropped and counted; a
JudgeBench pair is counted with the decision of an order not scored missing, as the
reference counts a failed judgement. Every figure comes with the count it was computed
over (`count`; JudgeBench's `judged`: pairs with a decision in at least one order), and a
figure over nothing judged is NaN, never a 0.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Callable, Mapping, Sequence

import numpy as np

from helpsteer_jax.data.formats.benchmarks import (
  JUDGEBENCH_CATEGORIES,
  RM_BENCH_DOMAINS,
  RM_BENCH_STYLES,
  JudgeBenchPair,
  RewardBench2Row,
  RMBenchRow,
)
from helpsteer_jax.scoring import rewards
from helpsteer_jax.scoring.scorer import Scorer, predict_groups

TIES_WEIGHTS = {"tied_accuracy": 0.30, "ref_accuracy": 0.30, "correctness_preferred": 0.20,
                "correctness_preferred_hard": 0.20, "correctness_margin": 0.01}


# ---------------------------------------------------------------- RM-Bench


def rm_bench_matrix(r_chosen: np.ndarray, r_rejected: np.ndarray) -> dict:
  """{matrix [3, 3], hard, normal, easy, average} of [n, 3] chosen and rejected rewards."""
  right = np.asarray(r_chosen)[:, :, None] > np.asarray(r_rejected)[:, None, :]
  m = right.mean(axis=0) if len(right) else np.full((RM_BENCH_STYLES,) * 2, np.nan)
  upper, lower = np.triu_indices(RM_BENCH_STYLES, 1), np.tril_indices(RM_BENCH_STYLES, -1)
  hard, normal, easy = float(m[upper].mean()), float(np.diag(m).mean()), float(m[lower].mean())
  return {"count": len(right), "matrix": m.tolist(), "hard": hard, "normal": normal,
          "easy": easy, "average": float(np.mean([hard, normal, easy]))}


def rm_bench_scores(r_chosen: np.ndarray, r_rejected: np.ndarray,
                    domains: Sequence[str]) -> dict:
  """RM-Bench's results: per domain (those present) and their means; rows with a reward
  not scored (NaN) dropped."""
  r_chosen, r_rejected = np.asarray(r_chosen, np.float64), np.asarray(r_rejected, np.float64)
  ok = ~(np.isnan(r_chosen).any(axis=1) | np.isnan(r_rejected).any(axis=1))
  domains = np.asarray(domains)
  by_domain = {d: rm_bench_matrix(r_chosen[ok & (domains == d)], r_rejected[ok & (domains == d)])
               for d in RM_BENCH_DOMAINS if (ok & (domains == d)).any()}
  mean = {k: (float(np.mean([v[k] for v in by_domain.values()])) if by_domain else float("nan"))
          for k in ("hard", "normal", "easy", "average")}
  return {"overall": mean.pop("average"), **mean, "count": int(ok.sum()),
          "dropped": int((~ok).sum()), "by_domain": by_domain}


# ---------------------------------------------------------------- JudgeBench


def flip(decision: str | None) -> str | None:
  return {"A>B": "B>A", "B>A": "A>B"}.get(decision, decision)


def decision(r_first: float, r_second: float) -> str | None:
  """A judgement of the first response against the second from their rewards."""
  if np.isnan(r_first) or np.isnan(r_second):
    return None
  return "A>B" if r_first > r_second else "B>A" if r_first < r_second else "A=B"


def judgebench_correct(label: str, first: str | None, swapped: str | None) -> bool:
  """Whether the two judgements (the second made on the swapped pair) get `label`."""
  votes = 0
  for d in (first, flip(swapped)):
    votes += (d == label) - (d == flip(label))
  return votes > 0


def judgebench_scores(r_ab: np.ndarray, r_ba: np.ndarray, labels: Sequence[str],
                      categories: Sequence[str]) -> dict:
  """JudgeBench's results from [n, 2] rewards of each pair in order [A, B] and [B, A]."""
  first = [decision(a, b) for a, b in np.asarray(r_ab, np.float64)]
  swapped = [decision(b, a) for b, a in np.asarray(r_ba, np.float64)]
  right = np.asarray([judgebench_correct(*x) for x in zip(labels, first, swapped)], bool)
  judged = np.asarray([a is not None or b is not None for a, b in zip(first, swapped)], bool)
  categories = np.asarray(categories)

  def accuracy(keep: np.ndarray) -> float:
    return float(right[keep].mean()) if judged[keep].any() else float("nan")

  return {"accuracy": accuracy(np.ones(len(right), bool)), "count": len(right),
          "judged": int(judged.sum()),
          "unjudged": sum(a is None or b is None for a, b in zip(first, swapped)),
          "inconsistent": sum(a != flip(b) for a, b in zip(first, swapped)),
          "by_category": {c: {"count": int((categories == c).sum()),
                              "judged": int(judged[categories == c].sum()),
                              "accuracy": accuracy(categories == c)}
                          for c in JUDGEBENCH_CATEGORIES if (categories == c).any()}}


# ---------------------------------------------------------------- RewardBench 2


def best_of_n(scores: np.ndarray) -> float:
  """The first completion's share of the maximum: 1 / (count at the maximum), else 0."""
  scores = np.asarray(scores, np.float64)
  top = scores.max()
  return float(1.0 / np.sum(scores == top)) if scores[0] == top else 0.0


def _prompt_stats(scores: np.ndarray, correct: np.ndarray) -> tuple[bool, float, float]:
  """(accurate, spread of the correct rewards or NaN under two, worst correct - best
  incorrect) of one Ties prompt."""
  good, bad = scores[correct], scores[~correct]
  spread = float(good.max() - good.min()) if len(good) > 1 else float("nan")
  margin = float(good.min() - bad.max())
  return margin > 0, spread, margin


def ties_score(rows: Sequence[tuple[str, int, np.ndarray, int]]) -> dict:
  """The Ties subset's score and its terms from (kind "ref"/"tied", prompt number,
  rewards [k], num_correct) per row."""
  samples: dict[tuple[str, int], list[tuple[bool, float]]] = defaultdict(list)
  for kind, number, scores, num_correct in rows:
    samples[kind, number] += [(i < num_correct, float(s)) for i, s in enumerate(scores)]
  stats = {"ref": {}, "tied": {}}
  for (kind, number), group in samples.items():
    correct = np.asarray([c for c, _ in group])
    stats[kind][number] = _prompt_stats(np.asarray([s for _, s in group]), correct)
  ref, tied = stats["ref"], stats["tied"]
  both = sorted(set(ref) & set(tied))
  spread = np.asarray([tied[p][1] for p in both], np.float64)
  m_tied = np.asarray([tied[p][2] for p in both], np.float64)
  m_hard = np.minimum(np.asarray([ref[p][2] for p in both], np.float64), m_tied)
  with np.errstate(divide="ignore", invalid="ignore"):
    margin = np.nan_to_num(np.tanh(m_hard / spread - 1), nan=0.0)
  mean = (lambda x: float(np.mean(x)) if len(x) else float("nan"))
  terms = {"tied_accuracy": mean([s[0] for s in tied.values()]) if tied else 0.0,
           "ref_accuracy": mean([s[0] for s in ref.values()]) if ref else 0.0,
           "correctness_preferred": mean(m_tied > spread),
           "correctness_preferred_hard": mean(m_hard > spread),
           "correctness_margin": mean(margin)}
  return {"score": float(sum(TIES_WEIGHTS[k] * v for k, v in terms.items())), **terms}


def rewardbench2_scores(scores: Sequence[np.ndarray], rows: Sequence[RewardBench2Row]) -> dict:
  """RewardBench 2's results from each row's completion rewards; rows with a reward not
  scored (NaN) dropped."""
  ok = [not np.isnan(s).any() for s in scores]
  by_subset: dict[str, dict] = {}
  for subset in sorted({r.subset for r, k in zip(rows, ok) if k}):
    kept = [(r, s) for r, s, k in zip(rows, scores, ok) if k and r.subset == subset]
    if kept[0][0].is_ties:
      result = ties_score([(*r.ties_key(), s, r.num_correct) for r, s in kept])
    else:
      result = {"score": float(np.mean([best_of_n(s) for _, s in kept]))}
    by_subset[subset] = {"count": len(kept), **result}
  overall = (float(np.mean([v["score"] for v in by_subset.values()])) if by_subset
             else float("nan"))
  return {"score": overall, "count": int(sum(ok)), "dropped": len(ok) - int(sum(ok)),
          "by_subset": by_subset}


# ---------------------------------------------------------------- with a scorer


def _rewards(groups, scorer: Scorer, weights, on_batch) -> list[np.ndarray]:
  return [rewards.rewards(p, weights) for p in predict_groups(groups, scorer, on_batch)]


def evaluate_rm_bench(scorer: Scorer, rows: Sequence[RMBenchRow], weights,
                      on_batch=None) -> dict:
  """RM-Bench's results: each row's 6 responses one group."""
  r = np.asarray(_rewards([row.conversations for row in rows], scorer, weights, on_batch),
                 np.float64).reshape(len(rows), 2 * RM_BENCH_STYLES)
  return rm_bench_scores(r[:, :RM_BENCH_STYLES], r[:, RM_BENCH_STYLES:],
                         [row.domain for row in rows])


def evaluate_judgebench(scorer: Scorer, pairs: Sequence[JudgeBenchPair], weights,
                        on_batch=None) -> dict:
  """JudgeBench's results: every pair as the group [A, B], then every pair as [B, A]."""
  groups = ([(p.response_a, p.response_b) for p in pairs] +
            [(p.response_b, p.response_a) for p in pairs])
  r = np.asarray(_rewards(groups, scorer, weights, on_batch), np.float64).reshape(-1, 2)
  return judgebench_scores(r[:len(pairs)], r[len(pairs):], [p.label for p in pairs],
                           [p.category for p in pairs])


def evaluate_rewardbench2(scorer: Scorer, rows: Sequence[RewardBench2Row], weights,
                          on_batch=None) -> dict:
  """RewardBench 2's results: each row's completions one group."""
  return rewardbench2_scores(_rewards([r.completions for r in rows], scorer, weights,
                                      on_batch), rows)


@dataclasses.dataclass(frozen=True)
class Benchmark:
  """A benchmark's evaluation, the number of conversations it scores and its groups of
  conversations (each answering one prompt, as a pairwise judge sees them)."""
  evaluate: Callable[..., dict]
  size: Callable[[Sequence], int]
  groups: Callable[[Sequence], list]


BENCHMARKS: Mapping[str, Benchmark] = {
    "rm_bench": Benchmark(evaluate_rm_bench,
                          lambda rows: 2 * RM_BENCH_STYLES * len(rows),
                          lambda rows: [row.conversations for row in rows]),
    "judgebench": Benchmark(evaluate_judgebench, lambda pairs: 4 * len(pairs),
                            lambda pairs: [(p.response_a, p.response_b) for p in pairs]),
    "rewardbench2": Benchmark(evaluate_rewardbench2,
                              lambda rows: sum(len(r.completions) for r in rows),
                              lambda rows: [r.completions for r in rows]),
}
