"""generate with two processes writes the file of one process (sampling, best of 2,
scored by the attribute rules plus a principle judge), and a two-process run that loses
process 0 resumes to it.

The reward is the demo rules and a principle judge as one (`scorer.principle_source`):
the rules split over the processes, the judge reasoning greedily on its engine and its
forward pass, both sharded over both processes' devices.

The harness and what every two-process test checks: tests/task_groups.py.
"""

import json
import math

import pytest

import task_groups as tg

pytestmark = pytest.mark.multihost

BATCH = 8  # prompts per batch


def _generate(task_inputs, workdir) -> tuple[str, ...]:
  """Sampling (seeds matter) and best of 2 (the scores are split too)."""
  return ("--config=configs/generate.py", *tg.MODEL, *tg.MESH,
          f"--config.tokenizer={task_inputs['tokenizer']}",
          f"--config.input={task_inputs['prompts']}",
          f"--config.batch_size={BATCH}", "--config.max_new_tokens=16", "--config.max_length=128",
          "--config.steer_attributes=helpsteer", "--config.sampling.temperature=0.8",
          "--config.sampling.top_k=40", "--config.best_of_n.n=2",
          "--config.scorer.source=demo_rules",
          f"--config.scorer.principle_source={task_inputs['backbone']}",
          "--config.scorer.principle=The response is short.",
          "--config.scorer.principle_coef=0.5", "--config.scorer.max_len=384",
          "--config.scorer.judge_max_new_tokens=4", f"--workdir={workdir}")


def test_generate_two_processes_killed_and_rerun_write_the_one_process_file(task_inputs,
                                                                            tmp_path):
  """Process 0 (the writer) killed mid-way, then both rerun: the one-process file; the
  rerun decodes the rows from the batch the killed run stopped in, split over the
  processes, and process 0 alone writes."""
  single = tmp_path / "single"
  proc = tg.single(*_generate(task_inputs, single))
  assert tg.split(proc.stderr, "generate: rows decoded") == [2 * tg.PROMPTS]  # best of 2
  out = tmp_path / "w" / "generations.jsonl"
  stopped, hung, written, run, results = tg.killed_and_rerun(
      tmp_path, _generate(task_inputs, tmp_path / "w"), 0, lambda: tg.lines(out), 8,
      tmp_path / "w")
  assert 8 <= written < tg.PROMPTS
  tg.assert_same(single, tmp_path / "w", "generations.jsonl")
  assert f"({written} already answered)" in results[0].stdout
  start = written - written % BATCH  # the batch it stopped in is answered whole
  tg.assert_split(tg.split(results[0].stderr, "generate: rows decoded"),
                  2 * (tg.PROMPTS - start))
  assert run.written(0, tmp_path / "w") == {"generations.jsonl"}
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert len(rows) == tg.PROMPTS
  helpfulness = [c["scores"]["helpfulness"] for r in rows for c in r["candidates"]]
  # the demo rules score whole numbers: the judge's half-weighted reward shows
  assert all(math.isfinite(h) for h in helpfulness)
  assert any(abs(h - round(h)) > 1e-3 for h in helpfulness)
  tg.assert_survivor_stopped(stopped, 0, hung)
