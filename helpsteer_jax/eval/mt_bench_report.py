"""MT-Bench scores per category and overall, as FastChat's `show_result` computes them.

A turn's score is the mean over its judged answers whose rating parsed (FastChat
drops -1 rows); "average" is the mean over both turns' parsed ratings. How many
replies did not parse, and how many requests failed, is reported beside the
scores, never folded into them.
"""

from __future__ import annotations

import pathlib
from typing import Sequence

import numpy as np

from helpsteer_jax.data.records import HELPSTEER_ATTRIBUTES
from helpsteer_jax.eval.mt_bench_grading import UNPARSED


def _mean(values: list[float]) -> float | None:
  return float(np.mean(values)) if values else None


def _summary(rows: Sequence[dict]) -> dict:
  parsed = [r for r in rows if r["score"] != UNPARSED]
  out = {"turn_1": _mean([r["score"] for r in parsed if r["turn"] == 1]),
         "turn_2": _mean([r["score"] for r in parsed if r["turn"] == 2]),
         "average": _mean([r["score"] for r in parsed]),
         "judged": len(rows), "unparsed": len(rows) - len(parsed)}
  scored = [r["attributes"] for r in rows if r.get("attributes")]
  if scored:
    out["attributes"] = {a: float(np.mean([s[a] for s in scored])) for a in scored[0]}
  return out


def score_table(rows: Sequence[dict], failures: int = 0) -> dict:
  """{"overall": ..., "categories": {category: ...}} from judgment rows."""
  categories = list(dict.fromkeys(r["category"] for r in rows))
  return {"overall": {**_summary(rows), "failed": failures},
          "categories": {c: _summary([r for r in rows if r["category"] == c])
                         for c in categories}}


def _fmt(value: float | None) -> str:
  return "-" if value is None else f"{value:.2f}"


def markdown(table: dict, score_name: str = "score") -> str:
  """One row per category and the overall row; predicted HelpSteer attributes
  (attribute-model judge) as extra columns."""
  with_attrs = "attributes" in table["overall"]
  attrs = [a for a in HELPSTEER_ATTRIBUTES if with_attrs and a in table["overall"]["attributes"]]
  head = (["category", f"{score_name} turn 1", f"{score_name} turn 2", "average", "judged",
           "unparsed"] + attrs)
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  entries = list(table["categories"].items()) + [("**overall**", table["overall"])]
  for name, s in entries:
    cells = [name, _fmt(s["turn_1"]), _fmt(s["turn_2"]), _fmt(s["average"]), str(s["judged"]),
             str(s["unparsed"])]
    cells += [_fmt(s.get("attributes", {}).get(a)) for a in attrs]
    lines.append("| " + " | ".join(cells) + " |")
  if table["overall"].get("failed"):
    lines.append(f"\n{table['overall']['failed']} judge requests failed after retries:"
                 " rerun the same command to ask them again.")
  return "\n".join(lines) + "\n"


def show_result(table: dict, model_id: str) -> str:
  """FastChat's `show_result.py` printout (first turn, second turn, average)."""
  o = table["overall"]
  parts = []
  for title, key, turn in (("First turn", "turn_1", "1"), ("Second turn", "turn_2", "2"),
                           ("Average", "average", "")):
    parts.append(f"\n########## {title} ##########\n{'':<24}{'score':>10}\n"
                 f"{model_id:<20}{turn:>4}{_fmt(o[key]):>10}")
  return "\n".join(parts) + "\n"


def plot(table: dict, path: pathlib.Path, title: str, score_name: str = "score") -> None:
  """Bars per category (turn 1, turn 2), written to `path` (PNG)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = list(table["categories"])
  x = np.arange(len(names))
  fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(names) + 2), 3.6))
  for k, (key, label) in enumerate((("turn_1", "turn 1"), ("turn_2", "turn 2"))):
    values = [table["categories"][n][key] for n in names]
    ax.bar(x + (k - 0.5) * 0.38, [np.nan if v is None else v for v in values], 0.38,
           label=label)
  ax.set_xticks(x, names, rotation=30, ha="right")
  ax.set_ylabel(score_name)
  ax.set_title(f"{title}: overall {_fmt(table['overall']['average'])}")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
