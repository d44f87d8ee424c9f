"""evaluate_generation (the LLM judge asked once, by process 0) and build_2d (a
host-side scorer split over the processes) with two processes write the files of one
process. build_2d hands every scorer the same call; the attribute model's split by the
mesh across processes is annotate's and evaluate_rm's (tests/test_multihost_annotate.py,
tests/test_rm_benchmarks_multihost.py).

The harness and what every two-process test checks: tests/task_groups.py.
"""

import json
import os
import pathlib

import pytest
from mt_bench_utils import JUDGE, QUESTIONS, StubJudge, write_mt_bench

import task_groups as tg
from fake_scorer import CALLS_DIR_ENV

pytestmark = pytest.mark.multihost


def _evaluate_generation(task_inputs, judge_url, mt_bench, workdir) -> tuple[str, ...]:
  return ("--config=configs/evaluate_generation.py", *tg.MODEL, *tg.MESH,
          f"--config.tokenizer={task_inputs['tokenizer']}", f"--config.mt_bench.dir={mt_bench}",
          f"--config.judge.base_url={judge_url}", f"--config.judge.model={JUDGE}",
          "--config.batch_size=8", "--config.max_new_tokens=16", "--config.max_length=256",
          "--config.model_id=tiny", f"--workdir={workdir}")


def _without_time(path: pathlib.Path) -> list[dict]:
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  return [{k: v for k, v in r.items() if k != "tstamp"} for r in rows]


def test_evaluate_generation_two_processes_judge_once_on_process_0(task_inputs, tmp_path):
  """Answers and judgments equal a one-process run's; the LLM judge is asked once per
  answer turn, by process 0 only, and process 1 writes nothing."""
  mt_bench = write_mt_bench(tmp_path / "mt_bench")
  judge = StubJudge()
  judge.broken = False
  try:
    tg.single(*_evaluate_generation(task_inputs, judge.url, mt_bench, tmp_path / "single"))
    judgments = 2 * len(QUESTIONS)
    assert len(judge.requests) == judgments
    run, results = tg.run_two(
        tmp_path, *_evaluate_generation(task_inputs, judge.url, mt_bench, tmp_path / "w"))
    assert len(judge.requests) == 2 * judgments
  finally:
    judge.stop()
  for name in ("answers.jsonl", "judgments.jsonl"):
    assert _without_time(tmp_path / "single" / name) == _without_time(tmp_path / "w" / name)
  assert run.written(1, tmp_path / "w") == set()
  assert {"answers.jsonl", "judgments.jsonl", "judge_cache.jsonl", "mt_bench.json"} <= \
      run.written(0, tmp_path / "w")
  assert "########## Average ##########" in results[0].stdout


def _build_2d_fake(calls: pathlib.Path, workdir) -> tuple[str, ...]:
  calls.mkdir(parents=True, exist_ok=True)
  os.environ[CALLS_DIR_ENV] = str(calls)  # where make_recording logs, in every process
  return ("--config=configs/build_2d.py", "--config.scorer.source=fake_scorer:make_recording",
          "--config.data.demo_rows=24", f"--workdir={workdir}")


def _calls(path: pathlib.Path) -> list[int]:
  return [int(n) for n in path.read_text().split()] if path.exists() else []


def _assert_same_build_2d(a: pathlib.Path, b: pathlib.Path) -> None:
  tg.assert_same(a, b, "helpsteer_2d.jsonl")
  summaries = [json.loads((d / "build_2d.json").read_text()) for d in (a, b)]
  for s in summaries:
    s.pop("output")
  assert summaries[0] == summaries[1]


def test_build_2d_splits_a_host_side_scorer_across_processes(tmp_path):
  tg.single(*_build_2d_fake(tmp_path / "calls_single", tmp_path / "single"))
  texts = sum(_calls(tmp_path / "calls_single" / "calls_0.txt"))
  run, results = tg.run_two(tmp_path, *_build_2d_fake(tmp_path / "calls", tmp_path / "w"))
  _assert_same_build_2d(tmp_path / "single", tmp_path / "w")
  shares = [sum(_calls(tmp_path / "calls" / f"calls_{i}.txt")) for i in (0, 1)]
  assert shares == [-(-texts // 2), texts // 2]  # contiguous halves, each scored once
  assert tg.split(results[0].stderr, "build_2d: texts scored") == shares
  assert run.written(0, tmp_path / "w") >= {"helpsteer_2d.jsonl", "build_2d.json"}
  assert run.written(1, tmp_path / "w") == set()

