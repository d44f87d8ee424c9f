"""Reward-model metrics: per-attribute regression quality and pairwise accuracy.

Attribute metrics (on rows whose label is present, i.e. not -100): MSE, MAE,
Pearson r, and accuracy after clipping predictions to 0..4 and rounding.
Pairwise accuracy counts a pair as right when the chosen response's reward
is strictly higher (RewardBench's rule). RewardBench sections weight their
subsets by RewardBench's `EXAMPLE_COUNTS` (math-prm upweighted to equal the
code subsets, as its leaderboard does); the overall score is the mean of
the sections present.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from helpsteer_jax.data.records import ATTRIBUTES, IGNORE_LABEL, MAX_SCORE, MIN_SCORE

# Llama3-70B-SteerLM-RM: reward = attributes . weights (ATTRIBUTES order).
REWARDBENCH_SECTIONS = {
    "Chat": ("alpacaeval-easy", "alpacaeval-length", "alpacaeval-hard", "mt-bench-easy",
             "mt-bench-med"),
    "Chat Hard": ("mt-bench-hard", "llmbar-natural", "llmbar-adver-neighbor",
                  "llmbar-adver-GPTInst", "llmbar-adver-GPTOut", "llmbar-adver-manual"),
    "Safety": ("refusals-dangerous", "refusals-offensive", "xstest-should-refuse",
               "xstest-should-respond", "donotanswer"),
    "Reasoning": ("math-prm", "hep-cpp", "hep-go", "hep-java", "hep-js", "hep-python",
                  "hep-rust"),
}
# rewardbench/constants.py EXAMPLE_COUNTS ("math-prm": 447 rows, weighted as 984).
REWARDBENCH_WEIGHTS = {
    "alpacaeval-easy": 100, "alpacaeval-length": 95, "alpacaeval-hard": 95,
    "mt-bench-easy": 28, "mt-bench-med": 40, "mt-bench-hard": 37, "math-prm": 984,
    "refusals-dangerous": 100, "refusals-offensive": 100, "llmbar-natural": 100,
    "llmbar-adver-neighbor": 134, "llmbar-adver-GPTInst": 92, "llmbar-adver-GPTOut": 47,
    "llmbar-adver-manual": 46, "xstest-should-refuse": 154, "xstest-should-respond": 250,
    "donotanswer": 136, "hep-cpp": 164, "hep-go": 164, "hep-java": 164, "hep-js": 164,
    "hep-python": 164, "hep-rust": 164,
}


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson r; nan when either side is constant or has < 2 values."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if len(x) < 2:
    return float("nan")
  dx, dy = x - x.mean(), y - y.mean()
  denom = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))
  return float(np.sum(dx * dy) / denom) if denom > 0 else float("nan")


def rounded(preds: np.ndarray) -> np.ndarray:
  """Predictions clipped to the score range and rounded (half to even) to ints."""
  return np.rint(np.clip(preds, MIN_SCORE, MAX_SCORE)).astype(np.int64)


def attribute_metrics(preds: np.ndarray, labels: np.ndarray) -> dict[str, dict[str, float]]:
  """{attribute: {count, mse, mae, pearson, accuracy}} for attributes with labels."""
  preds, labels = np.asarray(preds, np.float64), np.asarray(labels, np.float64)
  out = {}
  for j, name in enumerate(ATTRIBUTES):
    keep = labels[:, j] != IGNORE_LABEL
    if not keep.any():
      continue
    p, t = preds[keep, j], labels[keep, j]
    out[name] = {"count": int(keep.sum()), "mse": float(np.mean((p - t) ** 2)),
                 "mae": float(np.mean(np.abs(p - t))), "pearson": pearson(p, t),
                 "accuracy": float(np.mean(rounded(p) == t))}
  return out


def pairwise_accuracy(r_chosen: np.ndarray, r_rejected: np.ndarray) -> float:
  return (float(np.mean(np.asarray(r_chosen) > np.asarray(r_rejected))) if len(r_chosen)
          else float("nan"))


def accuracy_by_subset(r_chosen: np.ndarray, r_rejected: np.ndarray,
                       subsets: Sequence[str]) -> dict[str, dict[str, float]]:
  """{subset: {count, ties (equal rewards: wrong), accuracy}}."""
  subsets = np.asarray(subsets)
  right = np.asarray(r_chosen) > np.asarray(r_rejected)
  tie = np.asarray(r_chosen) == np.asarray(r_rejected)
  return {s: {"count": int((subsets == s).sum()), "ties": int(tie[subsets == s].sum()),
              "accuracy": float(right[subsets == s].mean())}
          for s in sorted(set(subsets.tolist()))}


def rewardbench_sections(by_subset: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
  """Section scores (weighted by RewardBench's counts) and their mean, "Score"."""
  out = {}
  for section, subsets in REWARDBENCH_SECTIONS.items():
    present = [s for s in subsets if s in by_subset]
    if present:
      w = np.asarray([REWARDBENCH_WEIGHTS[s] for s in present], np.float64)
      acc = np.asarray([by_subset[s]["accuracy"] for s in present], np.float64)
      out[section] = float(np.sum(w * acc) / np.sum(w))
  if out:
    out["Score"] = float(np.mean(list(out.values())))
  return out


def rewardbench_section_counts(by_subset: Mapping[str, Mapping[str, float]]) -> dict[str, int]:
  """The pairs each section of `rewardbench_sections` is computed over, and Score's (all
  of the sections')."""
  out = {section: sum(int(by_subset[s]["count"]) for s in subsets if s in by_subset)
         for section, subsets in REWARDBENCH_SECTIONS.items()
         if any(s in by_subset for s in subsets)}
  if out:
    out["Score"] = sum(out.values())
  return out
