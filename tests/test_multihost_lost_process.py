"""A lost host: process 1 killed with SIGKILL ends its peer (the peer watchdog), and a
rerun resumes from the last complete checkpoint to the uninterrupted run's losses.
Losing process 0, which hosts the coordination service, makes JAX end the other: the
generate and reference-pass kill tests check it (task_groups.assert_survivor_stopped).

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

