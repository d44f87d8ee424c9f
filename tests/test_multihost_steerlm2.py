"""SteerLM 2.0 with two processes writes the files of one process.

The harness and what every two-process test checks: tests/task_groups.py.
"""

import os

import pytest

import task_groups as tg

pytestmark = pytest.mark.multihost


def test_steerlm2_two_processes_write_the_one_process_files(task_inputs, tmp_path):
  """The groups file (samples, attribute log-probs, both models' log-probs) of two
  processes is the one process's byte for byte; process 1 writes none of it."""
  args = ("--config.scorer.source=fake_scorer:make", "--config.prompts.demo_rows=8",
          "--config.unconditional.with_label=false", "--config.eval.requests=4",
          "--config.prompts.per_iteration=4", "--config.eval.prompts=2",
          "--config.eval.scores=1,3", "--config.eval.max_new_tokens=8")
  tg.single(*tg.iterated("steerlm2", task_inputs, tmp_path / "single", *args))
  run, _ = tg.run_two(tmp_path, *tg.iterated("steerlm2", task_inputs, tmp_path / "w", *args))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "iteration_1/samples.jsonl",
                 "iteration_0/sweep_generations.jsonl", "iteration_1/sweep_generations.jsonl")
  assert {p.split(os.sep)[1] for p in run.written(1, tmp_path / "w")} <= {"checkpoints"}
