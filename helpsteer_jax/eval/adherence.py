"""Attribute adherence: do greedy answers have the attribute values their prompts ask for?

Each request asks for an attribute string (e.g. a held-out row's own labels);
its greedy answer is scored by the attribute model, and every requested
attribute's prediction is compared with its requested value. `errors` gives
the mean absolute error per attribute (and their mean), `table` one row per
model. The answers are appended batch by batch (`steering_sweep.answer_rows`,
resumable), one row per request with its nine predictions.
"""

from __future__ import annotations

import math
import pathlib
from typing import Mapping, Sequence

import numpy as np

from helpsteer_jax import resume
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.eval.steering_sweep import answer_rows
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.generator import Generator
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.scoring.scorer import Scorer


def answer(generator: Generator, requests: Sequence[steering.Request], out_path: pathlib.Path,
           *, batch_size: int, max_new_tokens: int, scorer: Scorer, seed: int = 0) -> int:
  """Appends the greedy, scored answers of `requests` not yet in `out_path`; returns how
  many were there already."""
  def batch(start: int, part: Sequence[steering.Request]) -> list[dict]:
    return answer_rows(generator, part, max_new_tokens, SamplingConfig(), seed + start, scorer)
  return resume.append_batches(out_path, requests, steering.Request.matches, "--workdir",
                               batch_size, batch)


def errors(rows: Sequence[Mapping]) -> dict[str, float | None]:
  """Per requested attribute, mean |prediction - requested| over the scored rows that ask
  for it (None when none does); `mean` is their mean over attributes."""
  diffs: dict[str, list[float]] = {}
  for row in rows:
    predicted = row.get("predicted")
    if not predicted:
      continue
    for name, value in row["attributes"].items():
      diffs.setdefault(name, []).append(abs(predicted[name] - value))
  out = {n: float(np.mean(diffs[n])) if diffs.get(n) else None for n in ATTRIBUTES
         if n in diffs}
  known = [v for v in out.values() if v is not None]
  out["mean"] = float(np.mean(known)) if known else None
  return out


def table(results: Mapping[str, Mapping[str, float | None]]) -> str:
  """Markdown: one row per model, a column per attribute and their mean."""
  names = list(dict.fromkeys(n for r in results.values() for n in r if n != "mean"))
  header = ["model"] + names + ["mean"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for label, row in results.items():
    cells = ["-" if row.get(n) is None or math.isnan(row[n]) else f"{row[n]:.3f}"
             for n in names + ["mean"]]
    lines.append("| " + " | ".join([label] + cells) + " |")
  return "\n".join(lines)
