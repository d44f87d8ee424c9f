"""generate with two processes writes the file of one process (sampling, best of 2);
a run that loses process 0 resumes to the same file.

The harness and what every two-process test checks: tests/task_groups.py.
"""

import pytest

import task_groups as tg

pytestmark = pytest.mark.multihost


def _generate(task_inputs, workdir) -> tuple[str, ...]:
  """Sampling (seeds matter) and best of 2 (the demo-rule scores are split too)."""
  return ("--config=configs/generate.py", *tg.MODEL, *tg.MESH,
          f"--config.tokenizer={task_inputs['tokenizer']}",
          f"--config.input={task_inputs['prompts']}",
          "--config.batch_size=8", "--config.max_new_tokens=16", "--config.max_length=128",
          "--config.steer_attributes=helpsteer", "--config.sampling.temperature=0.8",
          "--config.sampling.top_k=40", "--config.best_of_n.n=2", f"--workdir={workdir}")


@pytest.fixture(scope="module")
def generate_single(task_inputs, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("generate_single")
  proc = tg.single(*_generate(task_inputs, workdir))
  assert tg.split(proc.stderr, "generate: rows decoded") == [2 * tg.PROMPTS]  # best of 2
  return workdir


def test_generate_two_processes_write_the_one_process_file(task_inputs, generate_single, tmp_path):
  run, results = tg.run_two(tmp_path, *_generate(task_inputs, tmp_path / "w"))
  tg.assert_same(generate_single, tmp_path / "w", "generations.jsonl")
  tg.assert_split(tg.split(results[0].stderr, "generate: rows decoded"), 2 * tg.PROMPTS)
  assert run.written(0, tmp_path / "w") == {"generations.jsonl"}
  assert run.written(1, tmp_path / "w") == set()


def test_generate_resumes_after_process_0_is_killed(task_inputs, generate_single, tmp_path):
  out = tmp_path / "w" / "generations.jsonl"
  stopped, hung, written, results = tg.killed_and_rerun(
      tmp_path, _generate(task_inputs, tmp_path / "w"), 0, lambda: tg.lines(out), 8,
      tmp_path / "w")
  assert 8 <= written < tg.PROMPTS
  tg.assert_same(generate_single, tmp_path / "w", "generations.jsonl")
  assert f"({written} already answered)" in results[0].stdout
  tg.assert_survivor_stopped(stopped, 0, hung)
