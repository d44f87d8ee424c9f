"""Two processes (4 CPU devices each, gloo collectives) train like one with 8.

Both runs build the same (data=2, fsdp=2, tensor=2) mesh and see the same
global batches. In the two-process run the mesh spans both processes, each
process transfers only its devices' rows, Orbax writes one checkpoint
together, and only process 0 logs metrics and draws the progress bar.
"""

import json
import re

import numpy as np
import pytest

from helpsteer_jax.data.demo import rows as demo
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer

from cli_utils import run_main
from multiprocess import run_group

_RUN = ("--config=configs/acsft.py", "--config.model.hidden_size=64",
        "--config.model.intermediate_size=128", "--config.model.num_layers=2",
        "--config.train.seq_len=128", "--config.train.global_batch=8",
        "--config.train.micro_batch=4", "--config.train.loss_chunk_size=64",
        "--config.train.num_steps=3", "--config.train.log_every=1",
        "--config.train.eval_every=0", "--config.train.eval_batches=2",
        "--config.train.save_every=100", "--config.train.export_hf=False",
        "--config.optimizer.warmup_steps=1", "--config.mesh.data=2",
        "--config.mesh.fsdp=2", "--config.mesh.tensor=2")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  root = tmp_path_factory.mktemp("multihost")
  data = root / "data"
  data.mkdir()
  for split, n, seed in (("train", 48, 5), ("validation", 16, 6)):
    (data / f"{split}.jsonl").write_text(
        "\n".join(json.dumps(r) for r in demo.demo_rows(n, seed=seed)) + "\n")
  tokenizer = demo_tokenizer.build_demo_tokenizer(root / "tokenizer")
  return (f"--config.data.train_path={data}", f"--config.data.validation_path={data}",
          f"--config.tokenizer={tokenizer}")


def _losses(workdir):
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  train = {r["step"]: r["loss"] for r in rows if "loss" in r}
  evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
  return train, evals


@pytest.mark.multihost  # three CLI runs (about 1 min on an idle 2-core machine)
def test_two_processes_match_one_process(inputs, tmp_path):
  single = tmp_path / "single"
  run_main(*_RUN, *inputs, f"--workdir={single}", devices=8)

  multi = tmp_path / "multi"
  outs = [(r.stdout, r.stderr) for r in run_group(*_RUN, *inputs, f"--workdir={multi}")]
  assert "process 0 of 2" in outs[0][1] and "8 global devices" in outs[0][1]

  single_train, single_eval = _losses(single)
  multi_train, multi_eval = _losses(multi)
  assert sorted(multi_train) == [1, 2, 3]
  np.testing.assert_allclose([multi_train[s] for s in (1, 2, 3)],
                             [single_train[s] for s in (1, 2, 3)], rtol=2e-6)
  np.testing.assert_allclose(multi_eval, single_eval, rtol=2e-6)
  assert len(single_eval) == 1
  # One cooperative checkpoint of step 3 with both processes' data positions.
  step_dir = multi / "checkpoints" / "3"
  assert (step_dir / "state").is_dir()
  written = {p.name for p in (step_dir / "data").iterdir()}
  assert {"process_0-of-2.json", "process_1-of-2.json"} <= written
  # Every process feeds the same global batches, so one position serves any process count.
  assert ((step_dir / "data" / "process_0-of-2.json").read_text()
          == (step_dir / "data" / "process_1-of-2.json").read_text())
  # Process 1 neither draws a progress bar nor prints the summary.
  assert not re.search(r"s/step|step/s", outs[1][1])
  assert "acsft: finished at step 3" in outs[0][0] and "acsft:" not in outs[1][0]
