"""annotate with two processes writes the file of one process, and a two-process run that
loses process 1 resumes to it. (evaluate_rm: tests/test_rm_benchmarks_multihost.py.)

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


def test_annotate_two_processes_killed_and_rerun_write_the_one_process_file(task_inputs,
                                                                            tmp_path):
  """Process 1 killed mid-way, then both rerun: the one-process file; in each run the
  turns are scored split over the processes and process 0 alone writes."""
  single = tmp_path / "single"
  proc = tg.single(*_annotate(task_inputs, single))
  whole = json.loads((single / "annotate_summary.json").read_text())
  assert tg.split(proc.stderr, "annotate: sequences scored") == [
      whole["turns"] - whole["unscored_turns"]]
  out = tmp_path / "w" / "annotated.jsonl"
  stopped, hung, written, run, results = tg.killed_and_rerun(
      tmp_path, _annotate(task_inputs, tmp_path / "w"), 1, lambda: tg.lines(out), 16,
      tmp_path / "w")
  assert 16 <= written < tg.ANNOTATE_ROWS
  tg.assert_same(single, tmp_path / "w", "annotated.jsonl")
  resumed = json.loads((tmp_path / "w" / "annotate_summary.json").read_text())
  assert resumed["already_written"] == written
  assert resumed["written"] == whole["written"] - written == tg.ANNOTATE_ROWS - written
  tg.assert_split(tg.split(results[0].stderr, "annotate: sequences scored"),
                  resumed["turns"] - resumed["unscored_turns"])
  assert run.written(0, tmp_path / "w") == {"annotated.jsonl", "annotate_summary.json"}
  assert "annotate:" in results[0].stdout and "annotate:" not in results[1].stdout
  tg.assert_survivor_stopped(stopped, 1, hung)
