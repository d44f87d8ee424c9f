"""The vLLM comparison script's figures and table (the servers themselves are not run: CI has
no vLLM)."""

import importlib.util
import sys

import pytest

from conftest import REPO_ROOT


@pytest.fixture(scope="module")
def bench():
  sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # its `import common`
  spec = importlib.util.spec_from_file_location(
      "serve_vs_vllm", REPO_ROOT / "benchmarks" / "serve_vs_vllm.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_prompts_differ(bench):
  got = bench.prompts(64)
  assert len(got) == 64 and len(set(got)) == 64


def test_summarize_counts_tokens_over_wall_time(bench):
  got = bench.summarize([(90, 64, 1.0), (91, 32, 2.0), (92, 64, 3.0)], seconds=4.0)
  assert got["requests"] == 3 and got["completion_tokens"] == 160
  assert got["prompt_tokens"] == 273
  assert got["min_completion_tokens"] == 32
  assert got["tokens_per_s"] == pytest.approx(40.0)
  assert got["p50_latency_s"] == pytest.approx(2.0)
  assert 2.9 < got["p99_latency_s"] <= 3.0


def _row(server, dtype, level, tps, **extra):
  return {"server": server, "dtype": dtype, "concurrency": level, "requests": 4,
          "completion_tokens": 256, "tokens_per_s": tps, "p50_latency_s": 1.0,
          "p99_latency_s": 2.0, **extra}


def test_table_pairs_the_servers_per_dtype_and_level(bench):
  rows = [_row("ours", "float32", 1, 30.0, compiles_during_requests=0),
          _row("ours", "float32", 16, 90.0, compiles_during_requests=0),
          _row("vllm", "float32", 1, 20.0), _row("vllm", "float32", 16, 120.0),
          _row("vllm", "bfloat16", 1, 10.0)]
  table = bench.table_rows(rows)
  assert [r[:2] for r in table] == [["float32", "1"], ["float32", "16"], ["bfloat16", "1"]]
  assert all(len(r) == len(bench.HEADER) for r in table)
  assert table[0][2:5] == ["30.0", "20.0", "1.50x"]
  assert table[1][4] == "0.75x"
  assert table[0][7:] == ["64.0", "64.0", "0"]
  assert table[2][2] == "-" and table[2][3] == "10.0" and table[2][4] == "-"
