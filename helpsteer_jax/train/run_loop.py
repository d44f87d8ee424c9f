"""The loop every training run shares: steps, checkpoints, preemption, metrics, evals.

A run (`train.loop.Trainer`, `rl.trainer.RLTrainer`) supplies its step, how it saves
and evaluates and which metrics a step logs (`Hooks`); `run_steps` owns the rest, the
same for every task:

- steps `start + 1 .. end` (`train.num_steps`, or a `stop_at` below it);
- a checkpoint after every step (the checkpointer decides which it keeps), and on
  SIGTERM the step's checkpoint, then status `preempted` (`PreemptionSignal`: the
  same answer on every process, below);
- metrics.jsonl and TensorBoard through `train.metrics`, a progress bar with rates;
- evaluation every `train.eval_every` steps before the end, at the end (after the
  final checkpoint), and at step 0 of a fresh run when the hooks ask for it;
- the HF export of a finished run; a run resumed at its end reports what the run
  that got there logged.

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
from typing import Callable

import jax
import ml_collections
from absl import logging

from helpsteer_jax.progress import Progress
from helpsteer_jax.train import metrics as metrics_lib

_calls = 0  # this process's calls to the preemption sync point; never reset


@dataclasses.dataclass
class RunResult:
  status: str                # "finished" | "preempted" | "stopped"
  step: int
  last_metrics: dict[str, float]
  eval_metrics: dict[str, float]
  eval_history: list[dict[str, float]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Hooks:
  """What a run plugs into `run_steps`.

  `step(i)` runs step i + 1 from step i. `logged(step, force)` returns the metrics to
  log after `step`, the steps they cover and the progress bar's fields, or None to log
  nothing yet (`force`: the last step or a preempted one). `save(step, preempted)`
  and `save_final(step)` write checkpoints; `wait()` blocks on pending writes.
  `evaluate(step)` returns eval metrics ({} for none); `initial_eval` evaluates a
  fresh run's step 0. `export()` runs after a finished run (with `train.export_hf`).
  """
  step: Callable[[int], None]
  logged: Callable[[int, bool], tuple[dict[str, float], int, dict[str, str]] | None]
  save: Callable[[int, bool], None]
  save_final: Callable[[int], None]
  wait: Callable[[], None]
  evaluate: Callable[[int], dict[str, float]]
  initial_eval: bool = False
  export: Callable[[], None] | None = None


def run_steps(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, start: int,
              hooks: Hooks, stop_at: int | None = None) -> RunResult:
  """Runs steps from `start` to `train.num_steps` (or `stop_at`); see the module doc."""
  tc = config.train
  end = min(tc.num_steps, stop_at) if stop_at is not None else tc.num_steps
  writer = metrics_lib.MetricsWriter(workdir)
  progress = Progress(total=tc.num_steps, initial=start, desc=config.task)
  preemption = PreemptionSignal().install()
  last, evals, history, status = {}, {}, [], "finished"

  def evaluate(step: int) -> None:
    nonlocal evals
    evals = hooks.evaluate(step)
    if evals:
      history.append({"iteration": step, **evals})
      writer.write(step, evals, prefix="eval_")

  step = start
  try:
    if hooks.initial_eval and start == 0:
      evaluate(0)
    while step < end:
      hooks.step(step)
      step += 1
      preempted = preemption.reached(step)  # the same answer on every process
      hooks.save(step, preempted)
      logged = hooks.logged(step, step == end or preempted)
      if logged is not None:
        last, steps, shown = logged
        writer.write(step, last)
        progress.update(steps, **shown)
      if preempted:
        status = "preempted"
        break
      if tc.eval_every and step % tc.eval_every == 0 and step < end:
        evaluate(step)
    if status == "finished" and step < tc.num_steps:
      status = "stopped"
    if status != "preempted":
      hooks.save_final(step)
      evaluate(step)
    hooks.wait()
    if status == "finished" and hooks.export is not None and tc.export_hf:
      hooks.export()
  finally:
    preemption.uninstall()
    progress.close()
    writer.close()
  if step == start:  # a run resumed at its end: what the run that got there logged
    last = metrics_lib.last_logged(workdir, step)
  return RunResult(status, step, last, evals, history)



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
