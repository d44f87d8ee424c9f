"""Stopping for a preemption at the same step on every process.

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

import signal
import threading

import jax
from absl import logging

_calls = 0  # this process's calls to the sync point; never reset


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
