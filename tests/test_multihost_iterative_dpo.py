"""Iterative DPO with two processes writes the files of one process.

The harness and what every two-process test checks: tests/task_groups.py.
"""

import os

import pytest

import task_groups as tg

pytestmark = pytest.mark.multihost


def test_iterative_dpo_two_processes_write_the_one_process_files(task_inputs, tmp_path):
  args = ("--config.scorer.source=fake_scorer:make_brevity", "--config.prompts.eval_limit=4",
          "--config.prompts.demo_train_prompts=8", "--config.prompts.per_iteration=8",
          "--config.reference.batch=8", "--config.optimizer.warmup_steps=0")
  tg.single(*tg.iterated("iterative_dpo", task_inputs, tmp_path / "single", *args))
  run, _ = tg.run_two(tmp_path, *tg.iterated("iterative_dpo", task_inputs, tmp_path / "w", *args))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "iteration_1/samples.jsonl",
                 "iteration_1/pairs.jsonl", "iteration_0/eval.json")
  assert {p.split(os.sep)[1] for p in run.written(1, tmp_path / "w")} <= {
      "checkpoints", "reference"}
