"""AC-SFT through the command line stopped by a signal: SIGTERM saves and exits with the
preemption status (`runs.summary.PREEMPTED_EXIT`, not a finished run's 0) and the rerun
continues (full fine-tuning and LoRA); a SIGKILL during asynchronous saves resumes from
the last complete checkpoint.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpsteer_jax.runs.summary import PREEMPTED_EXIT

from cli_utils import TINY_RUN, run_main
from conftest import REPO_ROOT, xla_flags


def _metrics_steps(path):
  if not path.exists():
    return []
  return [json.loads(line)["step"] for line in path.read_text().splitlines()
          if line.strip() and "loss" in json.loads(line)]


@pytest.mark.parametrize("lora", [(), ("--config.model.lora.rank=4",)], ids=["full", "lora"])
def test_sigterm_saves_exits_preempted_and_the_rerun_continues(tmp_path, lora):
  args = ["--config=configs/acsft.py", f"--workdir={tmp_path}", *TINY_RUN, *lora,
          "--config.data.demo_train_rows=200", "--config.data.demo_validation_rows=16",
          "--config.train.num_steps=400", "--config.train.save_every=1000"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(8))
  proc = subprocess.Popen([sys.executable, "-m", "helpsteer_jax.main", *args], cwd=REPO_ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  metrics = tmp_path / "metrics.jsonl"
  deadline = time.time() + 300
  while len(_metrics_steps(metrics)) < 3 and time.time() < deadline and proc.poll() is None:
    time.sleep(0.5)
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  proc.send_signal(signal.SIGTERM)
  stdout, stderr = proc.communicate(timeout=300)
  assert PREEMPTED_EXIT not in (0, 1, 2, 75)  # finished, an error, a user error, a lost peer
  assert proc.returncode == PREEMPTED_EXIT, stderr[-3000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["status"] == "preempted" and summary["export"] is None
  stopped = summary["step"]
  assert (f"acsft: preempted at step {stopped}" in stdout and "rerun the same command to"
          f" resume (exit status {PREEMPTED_EXIT})" in stdout), stdout
  assert 3 <= stopped < 400
  assert str(stopped) in os.listdir(tmp_path / "checkpoints")
  assert not (tmp_path / "hf").exists()  # no export from an unfinished run
  assert not (tmp_path / "adapter").exists()

  finished = run_main(*args[:-2], f"--config.train.num_steps={stopped + 2}")
  assert finished.returncode == 0
  steps = _metrics_steps(metrics)
  assert steps[-2:] == [stopped + 1, stopped + 2]
  assert json.loads((tmp_path / "summary.json").read_text())["status"] == "finished"
  assert (tmp_path / ("adapter" if lora else "hf")).is_dir()


def _start_main(args):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(8))
  return subprocess.Popen([sys.executable, "-m", "helpsteer_jax.main", *args], cwd=REPO_ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _losses(path):
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def test_sigkill_during_async_saves_resumes_from_the_last_complete_checkpoint(tmp_path):
  """Saving every step asynchronously, a SIGKILL lands while a save is being written."""
  save_every = 1
  args = ["--config=configs/acsft.py", f"--workdir={tmp_path}", *TINY_RUN,
          "--config.data.demo_train_rows=200", "--config.data.demo_validation_rows=16",
          "--config.train.num_steps=400", f"--config.train.save_every={save_every}",
          "--config.train.keep_checkpoints=3"]
  proc = _start_main(args)
  metrics = tmp_path / "metrics.jsonl"
  deadline = time.time() + 300
  while len(_metrics_steps(metrics)) < 4 and time.time() < deadline and proc.poll() is None:
    time.sleep(0.2)
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  proc.kill()
  proc.communicate(timeout=60)
  before = _losses(metrics)
  last_logged = before[-1][0]
  complete = sorted(int(n) for n in os.listdir(tmp_path / "checkpoints") if n.isdigit())
  assert complete and last_logged - save_every <= complete[-1] <= last_logged + 1

  run_main(*args[:-3], f"--config.train.num_steps={last_logged + 2}",
           f"--config.train.save_every={save_every}")
  after = _losses(metrics)[len(before):]
  resumed_at = after[0][0] - 1
  assert resumed_at >= last_logged - save_every  # at most save_every steps lost
  assert [s for s, _ in after] == list(range(resumed_at + 1, last_logged + 3))
  earlier = dict(before)
  for step, loss in after:  # the replayed steps give bitwise the same losses
    if step in earlier:
      assert loss == earlier[step], step
  assert not any(".orbax-checkpoint-tmp" in n for n in os.listdir(tmp_path / "checkpoints"))
