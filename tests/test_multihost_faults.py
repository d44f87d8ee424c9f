"""Pod faults with real processes: preemption on some hosts, a lost host, bad launch flags.

Two processes of four CPU devices each train AC-SFT on a (data=2, fsdp=2,
tensor=2) mesh spanning both. The reference for every resumed run is the
uninterrupted two-process run of the same config: losses after a resume
must be bitwise equal to it (same processes, same program); a resume on one
process of eight devices must reproduce it to float32 rounding (its
collectives sum in another order).
"""

import json
import signal
import time

import numpy as np
import pytest
from test_multihost import inputs  # noqa: F401 - the shared data and tokenizer fixture

from cli_utils import run_main
from multiprocess import Group, free_port, run_group

pytestmark = [pytest.mark.multihost, pytest.mark.one_stack("3.12", reason=(
    "jax.distributed's newest fault handling; the 3.11 stack runs the task splits"))]

STEPS = 24
_RUN = ("--config=configs/acsft.py", "--config.model.hidden_size=64",
        "--config.model.intermediate_size=128", "--config.model.num_layers=2",
        "--config.train.seq_len=128", "--config.train.global_batch=8",
        "--config.train.micro_batch=4", "--config.train.loss_chunk_size=64",
        f"--config.train.num_steps={STEPS}", "--config.train.log_every=1",
        "--config.train.eval_every=0", "--config.train.eval_batches=0",
        "--config.train.save_every=1000", "--config.train.export_hf=False",
        "--config.optimizer.warmup_steps=1", "--config.mesh.data=2",
        "--config.mesh.fsdp=2", "--config.mesh.tensor=2")


def _losses(workdir) -> dict[int, float]:
  """Loss per step; a resumed run's rows come after the first run's."""
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


def _wait_for_steps(group: Group, workdir, steps: int, timeout: float = 300) -> None:
  deadline = time.monotonic() + timeout
  metrics = workdir / "metrics.jsonl"
  while time.monotonic() < deadline:
    if metrics.exists() and len(_losses(workdir)) >= steps:
      return
    if any(p.poll() is not None for p in group.procs):
      group.kill()
      raise AssertionError(f"a process ended before step {steps}:\n{group.stderr(0)[-3000:]}"
                           f"\n{group.stderr(1)[-3000:]}")
    time.sleep(0.05)
  group.kill()
  raise AssertionError(f"step {steps} not reached within {timeout} s")


def _checkpoints(workdir) -> list[int]:
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def uninterrupted(inputs, tmp_path_factory):  # noqa: F811
  workdir = tmp_path_factory.mktemp("uninterrupted")
  run_group(*_RUN, *inputs, f"--workdir={workdir}")
  losses = _losses(workdir)
  assert sorted(losses) == list(range(1, STEPS + 1))
  return losses


def _preempted(workdir, results) -> int:
  """Both processes exited 0 having stopped at one step, with one complete checkpoint of it."""
  for i, r in enumerate(results):
    assert r.returncode == 0, f"process {i}:\n{r.stderr[-4000:]}"
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["status"] == "preempted"
  step = summary["step"]
  assert 3 <= step < STEPS
  for i, r in enumerate(results):
    assert f"process {i} of 2 stops and saves after step {step}" in r.stderr
  assert _checkpoints(workdir) == [step]
  step_dir = workdir / "checkpoints" / str(step)
  assert (step_dir / "state" / "_METADATA").is_file()
  assert {p.name for p in (step_dir / "data").iterdir()} >= {"process_0-of-2.json",
                                                              "process_1-of-2.json"}
  assert not [p for p in (workdir / "checkpoints").iterdir() if "tmp" in p.name]
  return step


def test_sigterm_to_one_process_stops_both_at_one_step_and_resumes_bitwise(
    inputs, uninterrupted, tmp_path):  # noqa: F811
  workdir = tmp_path / "run"
  group = Group(*_RUN, *inputs, f"--workdir={workdir}")
  _wait_for_steps(group, workdir, 3)
  group.signal(1, signal.SIGTERM)
  step = _preempted(workdir, group.wait())
  assert "SIGTERM caught" in group.stderr(1) and "SIGTERM caught" not in group.stderr(0)

  run_group(*_RUN, *inputs, f"--workdir={workdir}")
  resumed = _losses(workdir)
  assert json.loads((workdir / "summary.json").read_text())["status"] == "finished"
  for s in range(1, STEPS + 1):  # bitwise: the same program on the same processes
    assert resumed[s] == uninterrupted[s], (s, step)


def test_sigterm_to_both_at_different_steps_stops_once_and_resumes_on_one_process(
    inputs, uninterrupted, tmp_path):  # noqa: F811
  workdir = tmp_path / "run"
  group = Group(*_RUN, *inputs, f"--workdir={workdir}")
  _wait_for_steps(group, workdir, 3)
  group.signal(0, signal.SIGTERM)
  _wait_for_steps(group, workdir, len(_losses(workdir)) + 1)
  group.signal(1, signal.SIGTERM)
  step = _preempted(workdir, group.wait())

  # One process of eight devices on another mesh (fsdp=4) restores the
  # two-process checkpoint (resharded; data position from process 0's file).
  proc = run_main(*_RUN, *inputs, f"--workdir={workdir}", "--config.mesh.data=1",
                  "--config.mesh.fsdp=4", "--config.mesh.tensor=2", devices=8)
  assert f"resuming at step {step}" in proc.stderr
  resumed = _losses(workdir)
  after = range(step + 1, STEPS + 1)
  np.testing.assert_allclose([resumed[s] for s in after], [uninterrupted[s] for s in after],
                             rtol=1e-5)


def test_a_lost_process_ends_the_survivor_and_a_rerun_resumes_bitwise(
    inputs, uninterrupted, tmp_path):  # noqa: F811
  workdir = tmp_path / "run"
  timeout = 10
  group = Group(*_RUN, *inputs, f"--workdir={workdir}", "--config.train.save_every=4",
                heartbeat_timeout=timeout)
  _wait_for_steps(group, workdir, 10)
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
  complete = _checkpoints(workdir)
  assert complete and complete[-1] % 4 == 0

  proc = run_group(*_RUN, *inputs, f"--workdir={workdir}")[0]
  assert f"resuming at step {complete[-1]}" in proc.stderr
  resumed = _losses(workdir)
  for s in range(complete[-1] + 1, STEPS + 1):
    assert resumed[s] == uninterrupted[s], s


def test_losing_process_0_ends_the_other_at_once(inputs, tmp_path):  # noqa: F811
  workdir = tmp_path / "run"
  group = Group(*_RUN, *inputs, f"--workdir={workdir}", heartbeat_timeout=10)
  _wait_for_steps(group, workdir, 3)
  killed_at = time.monotonic()
  group.signal(0, signal.SIGKILL)
  _, survivor = group.wait()
  assert survivor.returncode != 0
  assert time.monotonic() - killed_at < 60
  # process 0 hosted the coordination service: JAX's runtime ends the others itself
  assert ("leader task was preempted/died" in survivor.stderr
          or "Connection closed" in survivor.stderr)


def test_bad_launch_flags_fail_with_what_to_fix_within_the_timeout(tmp_path):
  smoke = ("--config=configs/model_smoke.py", f"--workdir={tmp_path}")
  port = free_port()

  def flags(n, i, timeout=60):
    return (f"--config.distributed.coordinator_address=localhost:{port}",
            f"--config.distributed.num_processes={n}", f"--config.distributed.process_id={i}",
            f"--config.distributed.initialization_timeout={timeout}")

  out_of_range = run_main(*smoke, *flags(2, 2), check=False, devices=4)
  assert out_of_range.returncode == 2
  assert "process_id=2 is out of range for distributed.num_processes=2" in out_of_range.stderr

  start = time.monotonic()  # nobody listens on the coordinator's port
  unreachable = run_main(*smoke, *flags(2, 1, timeout=8), check=False, devices=4)
  assert unreachable.returncode == 2 and time.monotonic() - start < 40
  assert unreachable.stderr.strip().splitlines()[-1].startswith(
      f"error: could not join the process group at localhost:{port} as process 1 of 2 within"
      " distributed.initialization_timeout=8 s")

  start = time.monotonic()
  group = Group(*smoke, n=2, distributed=[flags(2, 0), flags(3, 1)])
  results = group.wait(timeout=120)
  for r in results:
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1].endswith(
        "start every process with the same distributed.num_processes")
  assert "(id 1) was started with distributed.num_processes=3 but process 0 was started with 2" \
      in results[1].stderr
  assert time.monotonic() - start < 60
