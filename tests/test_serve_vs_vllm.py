"""The vLLM comparison script's figures and tables (the servers themselves are not run: CI has
no vLLM)."""

import importlib.util
import json
import os
import subprocess
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


@pytest.fixture(scope="module")
def memory(bench):
  import serve_memory  # benchmarks/, on the path since `bench`
  return serve_memory


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


def _memory(server, dtype, peak_gib, kv_gib, **extra):
  return {"server": server, "dtype": dtype, "peak_rss_bytes": peak_gib * 2**30,
          "kv_cache_bytes": kv_gib * 2**30, **extra}


def test_memory_table_pairs_the_servers_per_dtype(memory):
  rows = [_memory("ours", "float32", 2.5, 0.75,
                  first_start={"warmup_s": 80.0, "compiles": 94, "cache_hits": 0},
                  restart={"warmup_s": 12.5, "compiles": 94, "cache_hits": 90}),
          _memory("vllm", "float32", 5.75, 4),
          _memory("vllm", "bfloat16", 5.0, 4)]
  table = memory.memory_rows(rows)
  assert all(len(r) == len(memory.MEMORY_HEADER) for r in table)
  assert table[0] == ["float32", "2.50", "0.75", "5.75", "4", "80.0 / 94", "12.5 / 4"]
  assert table[1] == ["bfloat16", "-", "-", "5.00", "4", "-", "-"]


def test_kv_cache_bytes_from_the_exports_shapes(memory, tmp_path):
  # SmolLM2-135M's shapes: 30 layers, 3 of 9 heads for keys and values, 64 per head.
  (tmp_path / "config.json").write_text(json.dumps({
      "num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
      "num_key_value_heads": 3}))
  slots = 1024 + 8  # the largest slot count: max_length plus one chunk of serve.chunk_steps
  assert memory.kv_cache_bytes(tmp_path, 16, 1024, "float32") == 2 * 16 * slots * 30 * 3 * 64 * 4
  assert memory.kv_cache_bytes(tmp_path, 64, 1024, "bfloat16") == 2 * 64 * slots * 30 * 3 * 64 * 2


def test_warmup_record_reads_the_servers_line(memory, tmp_path):
  log = tmp_path / "ours.log"
  log.write_text("I1206 loading\nserve: bench ready: API http://127.0.0.1:1/v1, playground"
                 " http://127.0.0.1:1/ (warmed up in 12.3s (94 compiles, 90 of them read from"
                 " the compilation cache; 3.1s trace + 4.2s lower + 0.9s compile))\n")
  assert memory.warmup_record(log) == {"warmup_s": 12.3, "compiles": 94, "cache_hits": 90}
  log.write_text("the server died\n")
  assert memory.warmup_record(log) is None


def test_tree_pss_counts_a_childs_memory(memory):
  mine = memory.tree_pss(os.getpid())
  status = memory.proc_status(os.getpid())  # one read: RSS may grow between two
  assert mine > 0 and status["VmHWM"] >= status["VmRSS"] > 0
  child = subprocess.Popen([sys.executable, "-c", "import sys, time; b = bytearray(300 << 20);"
                            " print('ready', flush=True); time.sleep(60)"],
                           stdout=subprocess.PIPE, text=True)
  try:
    assert child.stdout.readline().strip() == "ready"
    assert memory.tree_pss(os.getpid()) - mine > 250 << 20
  finally:
    child.kill()
    child.wait()


def test_wave_spreads_an_events_gap_over_its_tokens_and_pairs_the_servers(bench):
  wave = bench.stream_wave
  count = lambda text: len(text.split())  # noqa: E731 - one token per word
  # one word, then three words 0.3 s later, then one word 0.1 s after that
  events = [(1.0, "a"), (1.3, "a b c d"), (1.4, "a b c d e")]
  assert wave.token_gaps(events, count) == [(1.3, pytest.approx(0.1))] * 3 + [
      (1.4, pytest.approx(0.1))]
  assert wave.token_gaps(events[:1], count) == []
  records = [{"server": s, "dtype": "float32", "running": 8, "newcomers": 8,
              "tbt_median_s": m, "tbt_p99_s": p, "tbt_p99_over_median": p / m,
              "tbt_median_before_s": b} for s, m, p, b in [("ours", 0.2, 0.5, 0.15),
                                                          ("vllm", 0.05, 0.4, None)]]
  assert wave.table_rows(records) == [
      ["float32", "8 + 8", "200 / 500", "2.50x", "150", "50 / 400", "8.00x", "-"]]
