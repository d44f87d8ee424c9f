"""evaluate_rm with two processes writes the report of one process: the attribute model's
batches split over the processes, the same predictions and rewards on both, process 0
alone writing. One run reads every kind of set: HelpSteer2-format validation rows (the
attribute metrics and their plot), preference pairs, RewardBench and the reward-model
benchmarks (RM-Bench, JudgeBench, RewardBench 2: whole groups per scorer call).

The harness and what every two-process test checks: tests/task_groups.py.
"""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpsteer_jax.data.demo import rows as demo

import task_groups as tg
import test_rm_benchmarks as bench

pytestmark = pytest.mark.multihost

TRAIN_ROWS, VALIDATION_ROWS = 8, 40  # the demo's splits (evaluate_rm reads validation)


def _evaluate(task_inputs, root, workdir) -> tuple[str, ...]:
  rb2 = bench.rb2_rows()
  if not (root / "rb2.parquet").exists():
    pq.write_table(pa.table({k: [r[k] for r in rb2] for k in rb2[0]}), root / "rb2.parquet")
    bench.write_json_list(root / "total_dataset.json", bench.rm_bench_rows()[:6])
    bench.write_jsonl(root / "jb.jsonl", bench.judgebench_rows())
    for write in (demo.write_demo_dataset, demo.write_demo_preference,
                  demo.write_demo_rewardbench):
      write(root / "demo", TRAIN_ROWS, VALIDATION_ROWS)
  return ("--config=configs/evaluate_rm.py", *tg.MESH, *tg.scorer(task_inputs),
          f"--config.data.validation_path={root / 'demo'}",
          f"--config.data.preference_path={root / 'demo'}",
          f"--config.data.rewardbench_path={root / 'demo' / 'rewardbench'}",
          f"--config.data.rm_bench_path={root / 'total_dataset.json'}",
          f"--config.data.judgebench_path={root / 'jb.jsonl'}",
          f"--config.data.rewardbench2_path={root / 'rb2.parquet'}", f"--workdir={workdir}")


def test_evaluate_rm_two_processes_write_the_one_process_report(task_inputs, tmp_path):
  proc = tg.single(*_evaluate(task_inputs, tmp_path, tmp_path / "single"))
  scored = tg.split(proc.stderr, "evaluate_rm: sequences scored")[0]
  report = json.loads((tmp_path / "single" / "rm_report.json").read_text())
  pairs = report["helpsteer2_preference"]["count"] + report["rewardbench"]["count"]
  assert scored == VALIDATION_ROWS + 2 * pairs + 6 * 6 + 4 * len(bench.judgebench_rows()) + sum(
      len(r["chosen"]) + len(r["rejected"]) for r in bench.rb2_rows())
  run, results = tg.run_two(tmp_path, *_evaluate(task_inputs, tmp_path, tmp_path / "w"))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "rm_report.json", "rm_attributes.png")
  tg.assert_split(tg.split(results[0].stderr, "evaluate_rm: sequences scored"), scored)
  assert {"rm_report.json", "rm_attributes.png"} <= run.written(0, tmp_path / "w")
  assert run.written(1, tmp_path / "w") == set()
  assert "| RM-Bench |" in results[0].stdout and "| RM-Bench |" not in results[1].stdout
