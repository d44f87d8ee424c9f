"""Shared pieces of the benchmark scripts: environment, timing, reporting.

Each benchmark runs JAX and PyTorch in the same process, interleaving their
timed repetitions so both see the same machine load, and reports medians.
Results go to `benchmarks/results/<name>.json` and to a marked table in the
README.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import re
import statistics
import sys
import time
from typing import Callable

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


def setup_cpu_process() -> None:
  """Re-exec with THP-backed malloc, pin to CPU, quiet TPU probing."""
  sys.path.insert(0, str(REPO))
  from helpsteer_jax import cpu_env
  cpu_env.reexec_with_malloc_tunables()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TPU_LOG_DIR", str(REPO / ".tpu_logs"))


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
  """Runs each callable once per round, round after round; seconds per call."""
  times: dict[str, list[float]] = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
  return times


def median(xs: list[float]) -> float:
  return statistics.median(xs)


def machine() -> dict:
  import jax
  import torch
  return {
      "cpu": platform.processor() or platform.machine(),
      "cores": os.cpu_count(),
      "jax": jax.__version__,
      "torch": torch.__version__,
      "torch_threads": torch.get_num_threads(),
      "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
      "date": time.strftime("%Y-%m-%d"),
  }


def write_result(name: str, result: dict) -> pathlib.Path:
  RESULTS.mkdir(parents=True, exist_ok=True)
  path = RESULTS / f"{name}.json"
  path.write_text(json.dumps(result, indent=2) + "\n")
  print(json.dumps(result, indent=2))
  return path


def update_readme_table(marker: str, header: list[str], rows: list[list[str]]) -> None:
  """Replaces the table between `<!-- marker -->` and `<!-- /marker -->`."""
  readme = REPO / "README.md"
  text = readme.read_text()
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  block = f"<!-- {marker} -->\n" + "\n".join(lines) + f"\n<!-- /{marker} -->"
  pattern = re.compile(rf"<!-- {re.escape(marker)} -->.*?<!-- /{re.escape(marker)} -->", re.S)
  if not pattern.search(text):
    raise SystemExit(f"README.md has no <!-- {marker} --> section to update")
  readme.write_text(pattern.sub(block, text))
