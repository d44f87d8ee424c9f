"""What a task reports when it ends: its JSON summary, the lines it prints and its exit
status.

Every task that trains (and can be preempted) writes `status` in summary.json:
`finished`, `stopped` (at a `stop_at` before `train.num_steps`) or `preempted` (a SIGTERM
or a pod's preemption notice: a checkpoint of the step every process stopped at, the
rerun resumes there). The command then exits 0, or `PREEMPTED_EXIT` for `preempted`, so
that a scheduler can tell "stopped, resumable: requeue" from "done" (launch/ requeues on
it; docs/operations.md).
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Mapping

import ml_collections
import numpy as np

from helpsteer_jax import processes

# The exit status of a run stopped by preemption with its checkpoint written: resumable.
# Not 0 (a finished run), 1 (an uncaught error), 2 (a user error) or 75 (a lost peer,
# distributed.PEER_LOST_EXIT), nor a signal's 128 + n.
PREEMPTED_EXIT = 3
PREEMPTED = "preempted"


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


def write_summary(path: str | pathlib.Path, summary: dict, *lines: str,
                  outputs: Mapping[str, str | pathlib.Path] | None = None) -> None:
  """Process 0 writes `summary` to `path` (indented JSON), prints `lines`, then what the
  run wrote and where: each of `outputs` ({what: path}) that exists, and the summary."""
  if not processes.is_primary():
    return
  pathlib.Path(path).write_text(json.dumps(_plain(summary), indent=2) + "\n")
  for line in lines:
    print(line)
  print(outputs_text({**(outputs or {}), "summary": path}))


def outputs_text(outputs: Mapping[str, str | pathlib.Path]) -> str:
  """`wrote:` and one `  what  path` line per output that exists (directories end in /)."""
  shown = [(what, pathlib.Path(p)) for what, p in outputs.items() if pathlib.Path(p).exists()]
  width = max((len(what) for what, _ in shown), default=0)
  return "\n".join(["wrote:"] + [f"  {what:<{width}}  {p}{'/' if p.is_dir() else ''}"
                                  for what, p in shown])


def run_outputs(workdir: str | pathlib.Path) -> dict[str, pathlib.Path]:
  """A training run's usual outputs: the HF export, checkpoints, metrics.jsonl."""
  workdir = pathlib.Path(workdir)
  return {"HF model": workdir / "hf", "checkpoints": workdir / "checkpoints",
          "metrics": workdir / "metrics.jsonl"}


def skipped_lines(report) -> tuple[str, ...]:
  """The line of a task's skipped bad records (a `BadRecordReport`), none when none was
  skipped: printed at the end, as `data.on_bad_record=skip` promises."""
  return (report.summary(),) if report.total else ()


def metrics_text(metrics: Mapping[str, float], prefix: str = "eval") -> str:
  """`; eval loss 1.2345, accuracy 0.5000` ("" when there are none)."""
  if not metrics:
    return ""
  return f"; {prefix} " + ", ".join(f"{k} {float(v):.4f}" for k, v in metrics.items())


def exit_status(summary) -> int:
  """The command's exit status for a task's returned summary: `PREEMPTED_EXIT` when its
  status is `preempted`, else 0."""
  status = summary.get("status") if isinstance(summary, Mapping) else None
  return PREEMPTED_EXIT if status == PREEMPTED else 0


def export_field(result) -> dict | None:
  """summary.json's `export`: the step the HF export holds and why (None: no export)."""
  return None if result.exported is None else result.exported.as_dict()


def outcome_text(result, unit: str = "step") -> str:
  """What a training task's first line adds about its outcome: the step the export
  holds and why, or how to resume a preempted run ("" otherwise)."""
  if result.status == PREEMPTED:
    return (f"; preempted: rerun the same command to resume (exit status"
            f" {PREEMPTED_EXIT})")
  return "" if result.exported is None else f"; exported {result.exported.text(unit)}"


def training_summary(result, **extra) -> dict:
  """The fields every training task's summary.json starts with."""
  return {"status": result.status, "step": result.step, "train": result.last_metrics,
          "eval": result.eval_metrics, "export": export_field(result), **extra}


def result_line(config: ml_collections.ConfigDict, result, task: str = "",
                loss: str = "loss") -> str:
  """`task: finished at step N; loss X` and the outcome (`outcome_text`), the first line a
  training task prints."""
  value = result.last_metrics.get("loss", float("nan"))
  return (f"{task or config.task}: {result.status} at step {result.step}; {loss}"
          f" {value:.4f}{outcome_text(result)}")
