"""evaluate_rm on the reward-model benchmarks with two processes writes the report of one
process: the attribute model's batches split over the processes, the same rewards on
both, process 0 alone writing.

The harness and what every two-process test checks: tests/task_groups.py.
"""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import task_groups as tg
import test_rm_benchmarks as bench

pytestmark = pytest.mark.multihost


def _evaluate(task_inputs, root, workdir) -> tuple[str, ...]:
  rb2 = bench.rb2_rows()
  if not (root / "rb2.parquet").exists():
    pq.write_table(pa.table({k: [r[k] for r in rb2] for k in rb2[0]}), root / "rb2.parquet")
    bench.write_json_list(root / "total_dataset.json", bench.rm_bench_rows()[:6])
    bench.write_jsonl(root / "jb.jsonl", bench.judgebench_rows())
  return ("--config=configs/evaluate_rm.py", *tg.MESH, *tg.scorer(task_inputs),
          f"--config.data.rm_bench_path={root / 'total_dataset.json'}",
          f"--config.data.judgebench_path={root / 'jb.jsonl'}",
          f"--config.data.rewardbench2_path={root / 'rb2.parquet'}", f"--workdir={workdir}")


def test_benchmarks_two_processes_write_the_one_process_report(task_inputs, tmp_path):
  proc = tg.single(*_evaluate(task_inputs, tmp_path, tmp_path / "single"))
  scored = tg.split(proc.stderr, "evaluate_rm: sequences scored")[0]
  assert scored == 6 * 6 + 4 * len(bench.judgebench_rows()) + sum(
      len(r["chosen"]) + len(r["rejected"]) for r in bench.rb2_rows())
  run, results = tg.run_two(tmp_path, *_evaluate(task_inputs, tmp_path, tmp_path / "w"))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "rm_report.json")
  tg.assert_split(tg.split(results[0].stderr, "evaluate_rm: sequences scored"), scored)
  assert "rm_report.json" in run.written(0, tmp_path / "w")
  assert run.written(1, tmp_path / "w") == set()
  assert "| RM-Bench |" in results[0].stdout and "| RM-Bench |" not in results[1].stdout
