"""Preemption on some hosts: a SIGTERM to one process, or to both at different steps,
stops both at one step with one checkpoint, each exiting with the preemption status
(`runs.summary.PREEMPTED_EXIT`), and the rerun (on the same processes, or on one process
of eight devices) resumes to the uninterrupted run's losses.

The runs and their reference: tests/training_groups.py.
"""

import json
import signal

import numpy as np
import pytest

from helpsteer_jax.runs.summary import PREEMPTED_EXIT

import training_groups as tr
from cli_utils import run_main
from multiprocess import Group, run_group

pytestmark = pytest.mark.multihost


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_training_group) -> dict[int, float]:
  """The uninterrupted two-process run's loss per step."""
  return tr.losses(uninterrupted_training_group)


def _preempted(workdir, results) -> int:
  """Both processes exited with the preemption status having stopped at one step, with one
  complete checkpoint of it."""
  for i, r in enumerate(results):
    assert r.returncode == PREEMPTED_EXIT, f"process {i}:\n{r.stderr[-4000:]}"
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["status"] == "preempted"
  step = summary["step"]
  assert 3 <= step < tr.STEPS
  for i, r in enumerate(results):
    assert f"process {i} of 2 stops and saves after step {step}" in r.stderr
  assert tr.checkpoints(workdir) == [step]
  step_dir = workdir / "checkpoints" / str(step)
  assert (step_dir / "state" / "_METADATA").is_file()
  assert {p.name for p in (step_dir / "data").iterdir()} >= {"process_0-of-2.json",
                                                              "process_1-of-2.json"}
  assert not [p for p in (workdir / "checkpoints").iterdir() if "tmp" in p.name]
  return step


def test_sigterm_to_one_process_stops_both_at_one_step_and_resumes_bitwise(
    training_inputs, uninterrupted, tmp_path):
  workdir = tmp_path / "run"
  group = Group(*tr.RUN, *training_inputs, f"--workdir={workdir}")
  tr.wait_for_steps(group, workdir, 3)
  group.signal(1, signal.SIGTERM)
  step = _preempted(workdir, group.wait())
  assert "SIGTERM caught" in group.stderr(1) and "SIGTERM caught" not in group.stderr(0)

  run_group(*tr.RUN, *training_inputs, f"--workdir={workdir}")
  resumed = tr.losses(workdir)
  assert json.loads((workdir / "summary.json").read_text())["status"] == "finished"
  for s in range(1, tr.STEPS + 1):  # bitwise: the same program on the same processes
    assert resumed[s] == uninterrupted[s], (s, step)


def test_sigterm_to_both_at_different_steps_stops_once_and_resumes_on_one_process(
    training_inputs, uninterrupted, tmp_path):
  workdir = tmp_path / "run"
  group = Group(*tr.RUN, *training_inputs, f"--workdir={workdir}")
  tr.wait_for_steps(group, workdir, 3)
  group.signal(0, signal.SIGTERM)
  tr.wait_for_steps(group, workdir, len(tr.losses(workdir)) + 1)
  group.signal(1, signal.SIGTERM)
  step = _preempted(workdir, group.wait())

  # One process of eight devices on another mesh (fsdp=4) restores the
  # two-process checkpoint (resharded; data position from process 0's file).
  proc = run_main(*tr.RUN, *training_inputs, f"--workdir={workdir}", "--config.mesh.data=1",
                  "--config.mesh.fsdp=4", "--config.mesh.tensor=2", devices=8)
  assert f"resuming at step {step}" in proc.stderr
  resumed = tr.losses(workdir)
  after = range(step + 1, tr.STEPS + 1)
  np.testing.assert_allclose([resumed[s] for s in after], [uninterrupted[s] for s in after],
                             rtol=1e-5)
