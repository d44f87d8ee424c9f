"""Reward-model reports: a printed table, a JSON file and a predicted-vs-true figure."""

from __future__ import annotations

import math
import pathlib

import numpy as np

from helpsteer_jax.data.records import ATTRIBUTES, IGNORE_LABEL, MAX_SCORE, MIN_SCORE
from helpsteer_jax.scoring.metrics import REWARDBENCH_SECTIONS


def _fmt(x: float) -> str:
  return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def attribute_table(metrics: dict[str, dict[str, float]]) -> str:
  """Per-attribute metrics as a Markdown table."""
  lines = ["| attribute | n | MSE | MAE | Pearson r | accuracy |", "|---|---|---|---|---|---|"]
  for name, m in metrics.items():
    lines.append(f"| {name} | {m['count']} | {_fmt(m['mse'])} | {_fmt(m['mae'])} |"
                 f" {_fmt(m['pearson'])} | {_fmt(m['accuracy'])} |")
  return "\n".join(lines)


def section_count(result: dict, section: str) -> int:
  """The pairs a RewardBench section's figure (or Score) was computed over."""
  return result.get("section_counts", {}).get(section, 0)


def pairs_table(title: str, result: dict) -> str:
  """Overall, per-section and per-subset pairwise accuracy as a Markdown table, each with
  the pairs it was computed over (n: pairs judged) and, overall and per subset, the ties
  among them (equal rewards: wrong)."""
  lines = [f"| {title} | n | ties | accuracy |", "|---|---|---|---|",
           f"| all | {result['count']} | {result.get('ties', '')} | {_fmt(result['accuracy'])} |"]
  for section, acc in result.get("sections", {}).items():
    lines.append(f"| section: {section} | {section_count(result, section)} | |"
                 f" {_fmt(acc)} |")
  for subset, m in result.get("by_subset", {}).items():
    if subset:
      lines.append(f"| {subset} | {m['count']} | {m.get('ties', '')} | {_fmt(m['accuracy'])} |")
  return "\n".join(lines)


def rm_bench_table(result: dict) -> str:
  """RM-Bench's hard / normal / easy / average per domain and overall."""
  lines = ["| RM-Bench | n | hard | normal | easy | average |", "|---|---|---|---|---|---|",
           f"| all | {result['count']} | {_fmt(result['hard'])} | {_fmt(result['normal'])} |"
           f" {_fmt(result['easy'])} | {_fmt(result['overall'])} |"]
  for domain, m in result["by_domain"].items():
    lines.append(f"| {domain} | {m['count']} | {_fmt(m['hard'])} | {_fmt(m['normal'])} |"
                 f" {_fmt(m['easy'])} | {_fmt(m['average'])} |")
  return "\n".join(lines)


def grouped_table(title: str, result: dict, figure: str, groups: str,
                  judged: bool = False) -> str:
  """`result[figure]` overall and per group (`result[groups]`) as a Markdown table:
  JudgeBench's accuracy per category (with `judged`: the pairs with a decision beside
  the pairs), RewardBench 2's score per subset."""
  def row(name: str, m: dict) -> str:
    count = f"{m['count']} | {m['judged']}" if judged else f"{m['count']}"
    return f"| {name} | {count} | {_fmt(m[figure])} |"

  head = f"| {title} | n | {'judged | ' if judged else ''}{figure} |"
  lines = [head, "|---|---|" + ("---|" if judged else "") + "---|", row("all", result)]
  lines += [row(name, m) for name, m in result[groups].items()]
  return "\n".join(lines)


_BENCHMARK_TABLES = {
    "rm_bench": rm_bench_table,
    "judgebench": lambda r: grouped_table("JudgeBench", r, "accuracy", "by_category", True),
    "rewardbench2": lambda r: grouped_table("RewardBench 2", r, "score", "by_subset")}
# A benchmark's column in the variants table: (title, its headline figure's result key, the
# key of the count that figure is computed over)
_HEADLINES = {"rm_bench": ("RM-Bench", "overall", "count"),
              "judgebench": ("JudgeBench", "accuracy", "judged"),
              "rewardbench2": ("RewardBench 2", "score", "count")}


def judged(name: str, result: dict) -> int:
  """The items a set's headline figure was computed over (a pair set's: its pairs)."""
  return result[_HEADLINES[name][2]] if name in _HEADLINES else result["count"]


def set_table(name: str, result: dict) -> str:
  """The table of one evaluated set: a benchmark's own, else pairwise accuracy."""
  return _BENCHMARK_TABLES[name](result) if name in _BENCHMARK_TABLES else pairs_table(
      name, result)


def variants_table(variants: dict[str, dict]) -> str:
  """One row per variant: its reward, the HelpSteer2- and HelpSteer3-Preference pairwise
  accuracy, the RewardBench sections (and their mean, Score) and the benchmarks'
  headline figures (RM-Bench overall, JudgeBench accuracy, RewardBench 2 score), each
  where evaluated with the count it was computed over in parentheses, as a Markdown
  table."""
  sections = [name for name in (*REWARDBENCH_SECTIONS, "Score")
              if any(name in v.get("rewardbench", {}).get("sections", {})
                     for v in variants.values())]
  pair_sets = [(key, title) for key, title in (
      ("helpsteer2_preference", "HelpSteer2-Preference"),
      ("helpsteer3_preference", "HelpSteer3-Preference"))
               if any(key in v for v in variants.values())]
  benchmarks = [name for name in _HEADLINES if any(name in v for v in variants.values())]
  head = ["variant", "reward", *(title for _, title in pair_sets),
          *(f"RB {s}" for s in sections), *(_HEADLINES[b][0] for b in benchmarks)]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, v in variants.items():
    rb = v.get("rewardbench", {})
    cells = [name, v["reward"],
             *(_cell(v[key]["accuracy"], v[key]["count"]) if key in v else _fmt(None)
               for key, _ in pair_sets),
             *(_cell(rb["sections"][s], section_count(rb, s))
               if s in rb.get("sections", {}) else _fmt(None) for s in sections),
             *(_cell(v[b][_HEADLINES[b][1]], judged(b, v[b])) if b in v
               else _fmt(None) for b in benchmarks)]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _cell(value: float, count: int) -> str:
  """A figure and, in parentheses, the count it was computed over."""
  return f"{_fmt(value)} ({count})"


def plot_attributes(preds: np.ndarray, labels: np.ndarray, path: str | pathlib.Path,
                    metrics: dict | None = None) -> list[str]:
  """One panel per labelled attribute: predicted vs. true (jittered); returns the
  attributes drawn."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = [n for j, n in enumerate(ATTRIBUTES) if (labels[:, j] != IGNORE_LABEL).any()]
  fig, axes = plt.subplots(1, max(len(names), 1), figsize=(3.2 * max(len(names), 1), 3.2),
                           squeeze=False)
  rng = np.random.RandomState(0)
  for ax, name in zip(axes[0], names):
    j = ATTRIBUTES.index(name)
    keep = labels[:, j] != IGNORE_LABEL
    true = labels[keep, j] + rng.uniform(-0.15, 0.15, keep.sum())
    ax.scatter(true, preds[keep, j], s=6, alpha=0.5)
    ax.plot([MIN_SCORE, MAX_SCORE], [MIN_SCORE, MAX_SCORE], "k--", lw=0.8)
    r = (metrics or {}).get(name, {}).get("pearson", float("nan"))
    ax.set_title(f"{name} (r={_fmt(r)})", fontsize=9)
    ax.set_xlabel("true")
    ax.set_ylabel("predicted")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return names
