"""The loop every training run shares: steps, checkpoints, preemption, metrics, evals.

A run (`train.loop.Trainer`, `rl.trainer.RLTrainer`) supplies its step, how it saves
and evaluates and which metrics a step logs (`Hooks`); `run_steps` owns the rest, the
same for every task:

- steps `start + 1 .. end` (`train.num_steps`, or a `stop_at` below it);
- a checkpoint after every step (the checkpointer decides which it keeps), and on
  SIGTERM the step's checkpoint, then status `preempted` (`PreemptionSignal`: the
  same answer on every process, below);
- metrics.jsonl and TensorBoard through `train.metrics`, a progress bar with rates;
- evaluation every `train.eval_every` steps before the end, at the end, and at step 0
  of a fresh run when the hooks ask for it; an evaluated step is saved after its
  evaluation, with its eval metrics;
- the HF export of a finished run: of its last step, or with `train.export_best` (a
  metric the evaluation reports, `train.export_best_mode` max or min) of its best
  evaluated step, as Hugging Face Trainer's `load_best_model_at_end`: the checkpointer
  keeps that checkpoint through pruning and records the metrics in it, so a resumed run
  knows the best without evaluating again (`checkpoint.BestMetric`); a fresh run's
  step 0, when evaluated, is a candidate too. `RunResult.exported` says which step the
  export holds and why. A run resumed at its end reports what the run that got there
  logged.

Stopping for a preemption at the same step on every process (`PreemptionSignal`):
A pod's hosts receive SIGTERM at different moments (or only some of them
do). If each process stopped when its own signal arrived, one would enter
the collective checkpoint save while another entered the next train step,
and both would block until the job was killed. So the decision is made
jointly:

- In a `jax.distributed` run, JAX's preemption sync manager owns SIGTERM. A
  process that receives it tells the coordination service; every process
  then reports the last counter it passed to
  `multihost_utils.reached_preemption_sync_point`, and the sync point is the
  largest plus one. Each process asks once per train step, with a counter
  that counts the calls of this process (the same sequence on every process,
  which run the same program), so the answer is True at the same step
  everywhere. A notice that arrives before the first step (while compiling,
  say) stops the run after its first step. Asking is a host-side mutex
  read: no device-to-host sync and no RPC per step.
- In a single process without `jax.distributed`, a SIGTERM handler sets a
  flag that the next step reads.
"""

from __future__ import annotations

import dataclasses
import pathlib
import signal
import threading
from typing import Any, Callable, Collection

import jax
import ml_collections
from absl import logging

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.progress import Progress
from helpsteer_jax.train import checkpoint as ckpt_lib
from helpsteer_jax.train import metrics as metrics_lib

_calls = 0  # this process's calls to the preemption sync point; never reset


@dataclasses.dataclass(frozen=True)
class Exported:
  """The step whose model a finished run exported, and why: the best evaluated one
  (`best`), or the last (`best` None)."""
  step: int
  best: ckpt_lib.Best | None = None

  def as_dict(self) -> dict[str, Any]:
    why = ({"chosen_by": "last step"} if self.best is None else
           {"chosen_by": f"best eval {self.best.metric} ({self.best.mode})",
            "metric": self.best.metric, "value": self.best.value, "mode": self.best.mode})
    return {"step": self.step, **why}

  def text(self, unit: str = "step") -> str:
    """`iteration 10, the best eval reward (max) -4.4100` / `the last step, 60`."""
    if self.best is None:
      return f"the last {unit}, {self.step}"
    return (f"{unit} {self.step}, the best eval {self.best.metric} ({self.best.mode})"
            f" {self.best.value:.4f}")


@dataclasses.dataclass
class RunResult:
  status: str                # "finished" | "preempted" | "stopped"
  step: int
  last_metrics: dict[str, float]
  eval_metrics: dict[str, float]
  eval_history: list[dict[str, float]] = dataclasses.field(default_factory=list)
  exported: Exported | None = None  # what the HF export holds (None: no export)


@dataclasses.dataclass
class Hooks:
  """What a run plugs into `run_steps`.

  `step(i)` runs step i + 1 from step i. `logged(step, force)` returns the metrics to
  log after `step`, the steps they cover and the progress bar's fields, or None to log
  nothing yet (`force`: the last step or a preempted one). `save(step, preempted,
  metrics)` and `save_final(step, metrics)` write checkpoints (`metrics`: the step's
  eval metrics, None when it was not evaluated); `wait()` blocks on pending writes.
  `evaluate(step)` returns eval metrics ({} for none); `initial_eval` evaluates a
  fresh run's step 0. `export(step)` runs after a finished run (with
  `train.export_hf`): the model of the current state (`step` None) or of checkpoint
  `step`. `best()` is the checkpointer's best evaluated checkpoint
  (`Checkpointer.best`), None without `train.export_best`.
  """
  step: Callable[[int], None]
  logged: Callable[[int, bool], tuple[dict[str, float], int, dict[str, str]] | None]
  save: Callable[[int, bool, dict[str, float] | None], None]
  save_final: Callable[[int, dict[str, float] | None], None]
  wait: Callable[[], None]
  evaluate: Callable[[int], dict[str, float]]
  initial_eval: bool = False
  export: Callable[[int | None], None] | None = None
  best: Callable[[], ckpt_lib.Best | None] = lambda: None


def best_metric(tc) -> ckpt_lib.BestMetric | None:
  """`train.export_best` and `train.export_best_mode` (None: export the last step);
  ConfigError naming what to set. The metric's name is checked by `check_reported`
  once the run knows what its evaluation reports."""
  name = tc.export_best
  if not name:
    return None
  if tc.export_best_mode not in ckpt_lib.MODES:
    raise ConfigError(f"train.export_best={name!r} needs train.export_best_mode=max or min"
                      f" (whether a higher or a lower eval {name} is better), got"
                      f" {tc.export_best_mode!r}")
  if not tc.eval_every:
    raise ConfigError(f"train.export_best={name!r} picks the best evaluated step, and"
                      " train.eval_every=0 evaluates only at the end: set train.eval_every")
  return ckpt_lib.BestMetric(name, tc.export_best_mode)


def check_reported(best: ckpt_lib.BestMetric | None, reported: Collection[str],
                   no_evaluation: str = "") -> None:
  """ConfigError unless the run evaluates (`no_evaluation`: "" when it does, else what to
  give it) and its evaluation reports `best`'s metric (`reported`: the names)."""
  if best is None:
    return
  if no_evaluation:
    raise ConfigError(f"train.export_best={best.name!r} needs an evaluation, and this run"
                      f" has none: {no_evaluation} (or set train.export_best=\"\" to export"
                      " the last step)")
  if best.name not in reported:
    raise ConfigError(f"train.export_best={best.name!r}: this run's evaluation reports"
                      f" {', '.join(sorted(reported))}; set one of them (or \"\" to export"
                      " the last step)")


def run_steps(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, start: int,
              hooks: Hooks, stop_at: int | None = None) -> RunResult:
  """Runs steps from `start` to `train.num_steps` (or `stop_at`); see the module doc."""
  tc = config.train
  end = min(tc.num_steps, stop_at) if stop_at is not None else tc.num_steps
  writer = metrics_lib.MetricsWriter(workdir)
  progress = Progress(total=tc.num_steps, initial=start, desc=config.task)
  preemption = PreemptionSignal().install()
  last, evals, history, status, exported = {}, {}, [], "finished", None

  def evaluate(step: int) -> dict[str, float]:
    nonlocal evals
    evals = hooks.evaluate(step)
    if evals:
      history.append({"iteration": step, **evals})
      writer.write(step, evals, prefix="eval_")
    return evals

  step = start
  try:
    if hooks.initial_eval and start == 0:
      initial = evaluate(0)
      if initial and tc.export_best:  # the starting model is a candidate for the export
        hooks.save_final(0, initial)
    while step < end:
      hooks.step(step)
      step += 1
      preempted = preemption.reached(step)  # the same answer on every process
      evaluated = not preempted and (step == end or bool(
          tc.eval_every and step % tc.eval_every == 0))
      if not evaluated:  # an evaluated step is saved after its evaluation, below
        hooks.save(step, preempted, None)
      logged = hooks.logged(step, step == end or preempted)
      if logged is not None:
        last, steps, shown = logged
        writer.write(step, last)
        progress.update(steps, **shown)
      if preempted:
        status = "preempted"
        break
      if evaluated and step < end:
        hooks.save(step, False, evaluate(step))
    if status == "finished" and step < tc.num_steps:
      status = "stopped"
    if status != "preempted":
      hooks.save_final(step, evaluate(step))
    hooks.wait()
    if status == "finished" and hooks.export is not None and tc.export_hf:
      exported = _export(hooks, step, tc.export_best)
  finally:
    preemption.uninstall()
    progress.close()
    writer.close()
  if step == start:  # a run resumed at its end: what the run that got there logged
    last = metrics_lib.last_logged(workdir, step)
  return RunResult(status, step, last, evals, history, exported)


def _export(hooks: Hooks, step: int, export_best: str) -> Exported:
  """Exports the last step's model, or the best evaluated step's (`hooks.best`)."""
  best = hooks.best()
  if export_best and best is None:
    logging.warning("train.export_best=%s: no evaluation reported a value of it; exporting"
                    " the last step", export_best)
  if best is None or best.step == step:
    hooks.export(None)
    return Exported(step, best)
  logging.info("exporting step %d, the best eval %s (%s) %s; the last step is %d",
               best.step, best.metric, best.mode, best.value, step)
  hooks.export(best.step)
  return Exported(best.step, best)



def _sync_manager_present() -> bool:
  from jax._src import distributed as jax_distributed
  return jax_distributed.global_state.preemption_sync_manager is not None


class PreemptionSignal:
  """`reached()` is True at the step where every process stops and saves."""

  def __init__(self):
    self.joint = _sync_manager_present()
    self._event = threading.Event()
    self._previous = None

  def install(self) -> "PreemptionSignal":
    # With jax.distributed the runtime's own SIGTERM handler must stay in
    # place: replacing it would hide the notice from the other processes.
    if not self.joint and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    logging.warning("SIGTERM received: saving a checkpoint after this step")
    self._event.set()

  def reached(self, step: int) -> bool:
    """Called once per train step by every process; `step` is only logged."""
    if not self.joint:
      return self._event.is_set()
    global _calls
    _calls += 1
    from jax.experimental import multihost_utils
    stop = multihost_utils.reached_preemption_sync_point(_calls)
    if stop:
      logging.warning("preemption notice: process %d of %d stops and saves after step %d",
                      jax.process_index(), jax.process_count(), step)
    return stop

  def uninstall(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
