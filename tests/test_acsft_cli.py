"""AC-SFT through the command line: a short run, bad rows, SIGTERM and resume."""

import json
import os

import numpy as np
import pytest
import transformers
from torch_reference import needs_torch, torch

from helpsteer_jax.data.demo import rows as demo

from cli_utils import TINY_RUN, run_main


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
                  f"--config.data.validation_path={data_dir}", *TINY_RUN, check=False)
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
                  "--config.train.save_every=2", *TINY_RUN)
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


def test_unwritable_workdir_fails_before_training(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  proc = run_main("--config=configs/acsft.py", f"--workdir={blocker / 'run'}", *TINY_RUN,
                  check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "cannot write to the workdir" in proc.stderr and "Traceback" not in proc.stderr
