"""annotate and evaluate_rm with two processes write the files of one process; an
annotate run that loses process 1 resumes to the same file.

The harness and what every two-process test checks: tests/task_groups.py.
"""

import json

import pytest

import task_groups as tg

pytestmark = pytest.mark.multihost


def _annotate(task_inputs, workdir) -> tuple[str, ...]:
  return ("--config=configs/annotate.py", *tg.MESH, *tg.scorer(task_inputs),
          f"--config.data.input_path={task_inputs['rows']}",
          "--config.data.chunk_rows=8", f"--workdir={workdir}")


@pytest.fixture(scope="module")
def annotate_single(task_inputs, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("annotate_single")
  proc = tg.single(*_annotate(task_inputs, workdir))
  return workdir, tg.split(proc.stderr, "annotate: sequences scored")[0]


def test_annotate_two_processes_write_the_one_process_file(task_inputs, annotate_single,
                                                           tmp_path):
  single, scored = annotate_single
  run, results = tg.run_two(tmp_path, *_annotate(task_inputs, tmp_path / "w"))
  tg.assert_same(single, tmp_path / "w", "annotated.jsonl", "annotate_summary.json")
  tg.assert_split(tg.split(results[0].stderr, "annotate: sequences scored"), scored)
  assert run.written(0, tmp_path / "w") == {"annotated.jsonl", "annotate_summary.json"}
  assert run.written(1, tmp_path / "w") == set()
  assert "annotate:" in results[0].stdout and "annotate:" not in results[1].stdout


def test_annotate_resumes_after_process_1_is_killed(task_inputs, annotate_single, tmp_path):
  single, _ = annotate_single
  out = tmp_path / "w" / "annotated.jsonl"
  stopped, hung, written, _ = tg.killed_and_rerun(
      tmp_path, _annotate(task_inputs, tmp_path / "w"), 1, lambda: tg.lines(out), 16,
      tmp_path / "w")
  assert 16 <= written < tg.ANNOTATE_ROWS
  tg.assert_same(single, tmp_path / "w", "annotated.jsonl")
  assert json.loads((tmp_path / "w" / "annotate_summary.json").read_text())[
      "already_written"] == written
  tg.assert_survivor_stopped(stopped, 1, hung)


def _evaluate(task_inputs, workdir) -> tuple[str, ...]:
  return ("--config=configs/evaluate_rm.py", *tg.MESH, *tg.scorer(task_inputs),
          "--config.data.demo_train_rows=8", "--config.data.demo_validation_rows=40",
          f"--workdir={workdir}")


def test_evaluate_rm_two_processes_write_the_one_process_report(task_inputs, tmp_path):
  proc = tg.single(*_evaluate(task_inputs, tmp_path / "single"))
  scored = tg.split(proc.stderr, "evaluate_rm: sequences scored")[0]
  run, results = tg.run_two(tmp_path, *_evaluate(task_inputs, tmp_path / "w"))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "rm_report.json", "rm_attributes.png")
  tg.assert_split(tg.split(results[0].stderr, "evaluate_rm: sequences scored"), scored)
  assert {"rm_report.json", "rm_attributes.png"} <= run.written(0, tmp_path / "w")
  assert run.written(1, tmp_path / "w") == set()
