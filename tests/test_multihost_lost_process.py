"""A lost host: a process killed with SIGKILL ends its peer (the peer watchdog, or JAX
itself when process 0 hosted the coordination service), and a rerun resumes from the
last complete checkpoint to the uninterrupted run's losses.

The runs and their reference: tests/training_groups.py.
"""

import signal
import time

import pytest

import training_groups as tr
from multiprocess import Group, run_group

pytestmark = pytest.mark.multihost


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_training_group) -> dict[int, float]:
  """The uninterrupted two-process run's loss per step."""
  return tr.losses(uninterrupted_training_group)


def test_a_lost_process_ends_the_survivor_and_a_rerun_resumes_bitwise(
    training_inputs, uninterrupted, tmp_path):
  workdir = tmp_path / "run"
  timeout = 10
  group = Group(*tr.RUN, *training_inputs, f"--workdir={workdir}", "--config.train.save_every=4",
                heartbeat_timeout=timeout)
  tr.wait_for_steps(group, workdir, 8)
  killed_at = time.monotonic()
  group.signal(1, signal.SIGKILL)
  survivor, _ = group.wait()
  waited = time.monotonic() - killed_at
  assert survivor.returncode == 75, survivor.stderr[-3000:]
  assert waited < 60, waited
  last_line = survivor.stderr.strip().splitlines()[-1]
  assert last_line.startswith("error: process 0 of 2: process(es) [1] stopped sending"
                              f" heartbeats for {timeout} s"), last_line
  assert "rerun every process" in last_line
  complete = tr.checkpoints(workdir)
  assert complete and complete[-1] % 4 == 0

  proc = run_group(*tr.RUN, *training_inputs, f"--workdir={workdir}")[0]
  assert f"resuming at step {complete[-1]}" in proc.stderr
  resumed = tr.losses(workdir)
  for s in range(complete[-1] + 1, tr.STEPS + 1):
    assert resumed[s] == uninterrupted[s], s


def test_losing_process_0_ends_the_other_at_once(training_inputs, tmp_path):
  workdir = tmp_path / "run"
  group = Group(*tr.RUN, *training_inputs, f"--workdir={workdir}", heartbeat_timeout=10)
  tr.wait_for_steps(group, workdir, 3)
  killed_at = time.monotonic()
  group.signal(0, signal.SIGKILL)
  _, survivor = group.wait()
  assert survivor.returncode != 0
  assert time.monotonic() - killed_at < 60
  # process 0 hosted the coordination service: JAX's runtime ends the others itself
  assert ("leader task was preempted/died" in survivor.stderr
          or "Connection closed" in survivor.stderr)
