"""What a task reports when it ends: its JSON summary and the lines it prints."""

from __future__ import annotations

import json
import math
import pathlib

import ml_collections
import numpy as np

from helpsteer_jax import processes


def _plain(x):
  """JSON-ready: numpy scalars as Python numbers, NaN as null."""
  if isinstance(x, dict):
    return {k: _plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_plain(v) for v in x]
  if isinstance(x, (float, np.floating)):
    return None if math.isnan(float(x)) else float(x)
  if isinstance(x, np.integer):
    return int(x)
  return x


def write_summary(path: str | pathlib.Path, summary: dict, *lines: str) -> None:
  """Process 0 writes `summary` to `path` (indented JSON) and prints `lines`."""
  if not processes.is_primary():
    return
  pathlib.Path(path).write_text(json.dumps(_plain(summary), indent=2) + "\n")
  for line in lines:
    print(line)


def training_summary(result, **extra) -> dict:
  """The fields every training task's summary.json starts with."""
  return {"status": result.status, "step": result.step, "train": result.last_metrics,
          "eval": result.eval_metrics, **extra}


def result_line(config: ml_collections.ConfigDict, result, task: str = "",
                loss: str = "loss") -> str:
  """`task: finished at step N; loss X`, the first line a training task prints."""
  value = result.last_metrics.get("loss", float("nan"))
  return f"{task or config.task}: {result.status} at step {result.step}; {loss} {value:.4f}"
