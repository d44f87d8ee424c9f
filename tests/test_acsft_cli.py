"""AC-SFT through the command line: a short run, bad rows, SIGTERM and resume."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import transformers
from torch_reference import needs_torch, torch

from helpsteer_jax.data.demo import rows as demo

from cli_utils import run_main
from conftest import REPO_ROOT

# A tiny model and short run: compile once, a handful of steps.
_SHORT = ("--config.model.hidden_size=64", "--config.model.intermediate_size=128",
          "--config.model.num_layers=2", "--config.train.seq_len=128",
          "--config.train.global_batch=8", "--config.train.micro_batch=8",
          "--config.train.loss_chunk_size=64", "--config.train.log_every=1",
          "--config.train.eval_every=0", "--config.train.eval_batches=2",
          "--config.optimizer.warmup_steps=1")


def _write_rows(path, rows, bad_lines=()):
  lines = [json.dumps(r) for r in rows]
  for index, text in bad_lines:
    lines.insert(index, text)
  path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """HelpSteer2-layout directory whose train split has two bad rows (lines 3 and 6)."""
  out = tmp_path_factory.mktemp("data")
  rows = demo.demo_rows(120, seed=3)
  bad = [(2, '{"prompt": "What is 2+2?", "response": "4", "helpfulness": 7, "correctness": 4,'
             ' "coherence": 4, "complexity": 1, "verbosity": 1}'),
         (5, '{"prompt": "truncated json')]
  _write_rows(out / "train.jsonl", rows, bad)
  _write_rows(out / "validation.jsonl", demo.demo_rows(16, seed=4))
  return out


def test_bad_row_stops_the_run_naming_file_and_line(data_dir, tmp_path):
  proc = run_main("--config=configs/acsft.py", f"--workdir={tmp_path}",
                  f"--config.data.train_path={data_dir}",
                  f"--config.data.validation_path={data_dir}", *_SHORT, check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert f"{data_dir / 'train.jsonl'}:3" in proc.stderr
  assert "helpfulness" in proc.stderr and "on_bad_record" in proc.stderr


@pytest.fixture(scope="module")
def short_run(data_dir, tmp_path_factory):
  """Three steps skipping the bad rows, saving every two, exporting: (process, workdir)."""
  workdir = tmp_path_factory.mktemp("short_run")
  proc = run_main("--config=configs/acsft.py", f"--workdir={workdir}",
                  f"--config.data.train_path={data_dir}",
                  f"--config.data.validation_path={data_dir}",
                  "--config.data.on_bad_record=skip", "--config.train.num_steps=3",
                  "--config.train.save_every=2", *_SHORT)
  return proc, workdir


def test_short_run_skips_bad_rows_checkpoints_and_exports(short_run):
  proc, workdir = short_run
  assert "2 bad record(s) skipped" in proc.stdout
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["status"] == "finished" and summary["step"] == 3
  assert sum(summary["data"]["bad_records"].values()) == 2
  assert 0 < summary["data"]["packing_efficiency"] <= 1
  assert np.isfinite(summary["eval"]["loss"])
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "loss" in r]
  assert [r["step"] for r in train] == [1, 2, 3]
  for key in ("loss", "learning_rate", "grad_norm", "tokens_per_s", "step_time", "mfu"):
    assert key in train[-1], key
  assert any(name.startswith("events.out.tfevents")
             for name in os.listdir(workdir / "tensorboard"))
  assert sorted(os.listdir(workdir / "checkpoints"))[:2] == ["2", "3"]
  assert (workdir / "hf" / "config.json").is_file()


@needs_torch
def test_the_export_loads_in_transformers_and_runs(short_run):
  """The short run's exported HF directory loads in transformers and runs."""
  hf_dir = short_run[1] / "hf"
  model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir)
  tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
  ids = torch.tensor([tok("What is 3 + 4?").input_ids])
  with torch.no_grad():
    assert torch.isfinite(model(ids).logits).all()


def _metrics_steps(path):
  if not path.exists():
    return []
  return [json.loads(line)["step"] for line in path.read_text().splitlines()
          if line.strip() and "loss" in json.loads(line)]


@pytest.mark.parametrize("lora", [(), ("--config.model.lora.rank=4",)], ids=["full", "lora"])
def test_sigterm_saves_exits_zero_and_the_rerun_continues(tmp_path, lora):
  args = ["--config=configs/acsft.py", f"--workdir={tmp_path}", *_SHORT, *lora,
          "--config.data.demo_train_rows=200", "--config.data.demo_validation_rows=16",
          "--config.train.num_steps=400", "--config.train.save_every=1000"]
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8"
                       " --xla_backend_optimization_level=0")
  proc = subprocess.Popen([sys.executable, "-m", "helpsteer_jax.main", *args], cwd=REPO_ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  metrics = tmp_path / "metrics.jsonl"
  deadline = time.time() + 300
  while len(_metrics_steps(metrics)) < 3 and time.time() < deadline and proc.poll() is None:
    time.sleep(0.5)
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 0, stderr[-3000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["status"] == "preempted"
  stopped = summary["step"]
  assert 3 <= stopped < 400
  assert str(stopped) in os.listdir(tmp_path / "checkpoints")
  assert not (tmp_path / "hf").exists()  # no export from an unfinished run
  assert not (tmp_path / "adapter").exists()

  run_main(*args[:-2], f"--config.train.num_steps={stopped + 2}")
  steps = _metrics_steps(metrics)
  assert steps[-2:] == [stopped + 1, stopped + 2]
  assert json.loads((tmp_path / "summary.json").read_text())["status"] == "finished"
  assert (tmp_path / ("adapter" if lora else "hf")).is_dir()


def _start_main(args):
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8"
                       " --xla_backend_optimization_level=0")
  return subprocess.Popen([sys.executable, "-m", "helpsteer_jax.main", *args], cwd=REPO_ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _losses(path):
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def test_sigkill_during_async_saves_resumes_from_the_last_complete_checkpoint(tmp_path):
  """Saving every step asynchronously, a SIGKILL lands while a save is being written."""
  save_every = 1
  args = ["--config=configs/acsft.py", f"--workdir={tmp_path}", *_SHORT,
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


def test_unwritable_workdir_fails_before_training(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  proc = run_main("--config=configs/acsft.py", f"--workdir={blocker / 'run'}", *_SHORT,
                  check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "cannot write to the workdir" in proc.stderr and "Traceback" not in proc.stderr
