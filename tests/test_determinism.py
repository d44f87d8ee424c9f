"""Same config and seed -> bitwise-equal losses over 5 steps, for each training task."""

import json
import runpy

import pytest

from helpsteer_jax import tasks

from conftest import REPO_ROOT

_TINY_MODEL = dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                   num_kv_heads=2, attention_block_size=32)


def _config(task):
  config = runpy.run_path(str(REPO_ROOT / "configs" / f"{task}.py"))["get_config"]()
  config.model.update(_TINY_MODEL)
  config.mesh.update(data=2, fsdp=2, tensor=2)
  config.train.update(num_steps=5, global_batch=8, micro_batch=4, seq_len=128, log_every=1,
                      eval_every=0, eval_batches=1, save_every=100, export_hf=False,
                      loss_chunk_size=64)
  config.optimizer.update(warmup_steps=1)
  if task == "dpo2d":
    config.data.update(demo_train_pairs=24, demo_validation_pairs=0, max_segments=4)
    config.reference.batch = 4
  else:
    config.data.update(demo_train_rows=48, demo_validation_rows=8)
  return config


def _losses(workdir):
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [(r["step"], r["loss"], r["grad_norm"]) for r in rows if "grad_norm" in r]


@pytest.mark.parametrize("task", ["acsft", "attribute_model", "dpo2d"])
def test_two_runs_give_bitwise_equal_losses(task, tmp_path):
  run = tasks.get_task(task).run
  for name in ("a", "b"):
    run(_config(task), str(tmp_path / name))
  a, b = _losses(tmp_path / "a"), _losses(tmp_path / "b")
  assert [s for s, _, _ in a] == [1, 2, 3, 4, 5]
  assert a == b  # exact float equality, not a tolerance
