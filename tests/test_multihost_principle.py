"""The attribute model and a principle judge as one reward (`scorer.principle_source`)
with two processes: best-of-n's candidates, their scores and rewards are those of one
process (the demo rules split over the processes; the judge reasoning greedily on its
engine and its forward pass, both sharded over both processes' devices).

The harness and what every two-process test checks: tests/task_groups.py.
"""

import json
import math

import pytest

import task_groups as tg

pytestmark = pytest.mark.multihost


def _generate(task_inputs, workdir) -> tuple[str, ...]:
  return ("--config=configs/generate.py", *tg.MODEL, *tg.MESH,
          f"--config.tokenizer={task_inputs['tokenizer']}",
          f"--config.input={task_inputs['prompts']}",
          "--config.batch_size=8", "--config.max_new_tokens=16", "--config.max_length=128",
          "--config.steer_attributes=helpsteer", "--config.sampling.temperature=0.8",
          "--config.best_of_n.n=2", "--config.scorer.source=demo_rules",
          f"--config.scorer.principle_source={task_inputs['backbone']}",
          "--config.scorer.principle=The response is short.",
          "--config.scorer.principle_coef=0.5", "--config.scorer.max_len=512",
          "--config.scorer.judge_max_new_tokens=8",
          f"--workdir={workdir}")


def test_a_combined_reward_is_the_same_on_two_processes(task_inputs, tmp_path):
  tg.single(*_generate(task_inputs, tmp_path / "single"))
  run, _ = tg.run_two(tmp_path, *_generate(task_inputs, tmp_path / "w"))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "generations.jsonl")
  rows = [json.loads(line) for line in
          (tmp_path / "w" / "generations.jsonl").read_text().splitlines()]
  assert len(rows) == tg.PROMPTS
  helpfulness = [c["scores"]["helpfulness"] for r in rows for c in r["candidates"]]
  # the demo rules score whole numbers: the judge's half-weighted reward shows
  assert all(math.isfinite(h) for h in helpfulness)
  assert any(abs(h - round(h)) > 1e-3 for h in helpfulness)
  assert run.written(1, tmp_path / "w") == set()
