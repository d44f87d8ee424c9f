"""Two processes (4 CPU devices each, gloo collectives) train like one with 8, and
launch flags that cannot form a group fail saying what to fix.

Both runs build the same (data=2, fsdp=2, tensor=2) mesh and see the same
global batches (tests/training_groups.py; the two-process run is the fault tests'
uninterrupted reference, trained once per run). In the two-process run the mesh
spans both processes, each process transfers only its devices' rows, Orbax writes
one checkpoint together, and only process 0 logs metrics and draws the progress bar.
"""

import json
import re
import time

import numpy as np
import pytest

import training_groups as tr
from cli_utils import run_main
from multiprocess import Group, free_port


def _losses(workdir):
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  train = {r["step"]: r["loss"] for r in rows if "loss" in r}
  evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
  return train, evals


@pytest.mark.multihost  # a one-process CLI run beside the shared two-process run
@pytest.mark.version_tier  # the multi-process smoke test: jax.distributed, gloo, Orbax
def test_two_processes_match_one_process(training_inputs, uninterrupted_training_group,
                                         tmp_path):
  single = tmp_path / "single"
  run_main(*tr.RUN, *training_inputs, f"--workdir={single}", devices=8)

  multi = uninterrupted_training_group
  outs = [tr.output(multi, i) for i in (0, 1)]
  assert "process 0 of 2" in outs[0][1] and "8 global devices" in outs[0][1]

  single_train, single_eval = _losses(single)
  multi_train, multi_eval = _losses(multi)
  steps = list(range(1, tr.STEPS + 1))
  assert sorted(multi_train) == steps
  np.testing.assert_allclose([multi_train[s] for s in steps],
                             [single_train[s] for s in steps], rtol=2e-6)
  np.testing.assert_allclose(multi_eval, single_eval, rtol=2e-6)
  assert len(single_eval) == 1
  # One cooperative checkpoint of the last step with both processes' data positions.
  step_dir = multi / "checkpoints" / str(tr.STEPS)
  assert (step_dir / "state").is_dir()
  written = {p.name for p in (step_dir / "data").iterdir()}
  assert {"process_0-of-2.json", "process_1-of-2.json"} <= written
  # Every process feeds the same global batches, so one position serves any process count.
  assert ((step_dir / "data" / "process_0-of-2.json").read_text()
          == (step_dir / "data" / "process_1-of-2.json").read_text())
  # Process 1 neither draws a progress bar nor prints the summary.
  assert not re.search(r"s/step|step/s", outs[1][1])
  assert f"acsft: finished at step {tr.STEPS}" in outs[0][0] and "acsft:" not in outs[1][0]


@pytest.mark.multihost
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
