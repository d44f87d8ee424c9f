"""Memory and start-up figures of a server process, for benchmarks/serve_vs_vllm.py.

Peak resident memory from /proc (Linux): a process's VmHWM, or the largest
sampled PSS of a process tree (a server whose engine runs in child
processes); our engine's KV cache size from an export's shapes; our
server's warm-up line; and the docs table built from them.
"""

from __future__ import annotations

import json
import pathlib
import re
import threading

import psutil

CHUNK_STEPS = 8  # configs/serve.py's serve.chunk_steps

MEMORY_HEADER = ["dtype", "ours peak RSS (GiB)", "ours KV cache (GiB)", "vLLM peak RSS (GiB)",
                 "vLLM KV cache (GiB)", "ours warm-up, first start (s / compiles)",
                 "ours warm-up, restart (s / compiled, not read from the cache)"]
GIB = 2**30
WARMED_UP = re.compile(r"warmed up in ([0-9.]+)s \((\d+) compiles, (\d+) of them read")


def memory_rows(rows: list[dict]) -> list[list[str]]:
  """The memory table: one line per dtype, from each side's `memory` record."""
  by_key = {(r["server"], r["dtype"]): r for r in rows}
  out = []
  for dtype in dict.fromkeys(r["dtype"] for r in rows):
    ours, theirs = by_key.get(("ours", dtype)), by_key.get(("vllm", dtype))

    def cell(r, key, fmt="{:.2f}"):
      return fmt.format(r[key] / GIB) if r and r.get(key) is not None else "-"

    def warm(start):
      return (f"{start['warmup_s']:.1f} / {start['compiles'] - start.get('cache_hits', 0)}"
              if start else "-")

    out.append([dtype, cell(ours, "peak_rss_bytes"), cell(ours, "kv_cache_bytes"),
                cell(theirs, "peak_rss_bytes"), cell(theirs, "kv_cache_bytes", "{:.0f}"),
                warm(ours and ours.get("first_start")), warm(ours and ours.get("restart"))])
  return out


def kv_cache_bytes(model_dir: pathlib.Path, rows: int, max_length: int, dtype: str) -> int:
  """Our engine's keys and values at their largest slot count: rows x slots x layers x
  kv_heads x head_dim x 2, in the compute dtype."""
  from helpsteer_jax.inference import engine_steps
  cfg = json.loads((model_dir / "config.json").read_text())
  head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
  kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
  slots = max(engine_steps.length_buckets(max_length, CHUNK_STEPS))
  itemsize = 2 if dtype == "bfloat16" else 4
  return 2 * rows * slots * cfg["num_hidden_layers"] * kv_heads * head_dim * itemsize


def proc_status(pid: int) -> dict[str, int]:
  """VmRSS / VmHWM of `pid` in bytes (Linux)."""
  out = {}
  for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
    key, _, value = line.partition(":")
    if key in ("VmRSS", "VmHWM"):
      out[key] = int(value.split()[0]) * 1024
  return out


def tree_pss(pid: int) -> int:
  """Proportional set size of `pid` and its descendants in bytes (shared pages counted
  once over the tree; processes gone meanwhile count 0)."""
  try:
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
  except psutil.NoSuchProcess:
    return 0
  total = 0
  for proc in procs:
    try:
      total += proc.memory_full_info().pss
    except (psutil.NoSuchProcess, psutil.AccessDenied):
      continue
  return total


class PeakSampler:
  """The largest `tree_pss` of a process tree, sampled every `every` seconds."""

  def __init__(self, pid: int, every: float = 0.5):
    self.pid, self.every, self.peak = pid, every, 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _run(self) -> None:
    while not self._stop.is_set():
      self.peak = max(self.peak, tree_pss(self.pid))
      self._stop.wait(self.every)

  def stop(self) -> int:
    self._stop.set()
    self._thread.join()
    return self.peak


def warmup_record(log: pathlib.Path) -> dict | None:
  """Our server's warm-up line: seconds, programs compiled, and how many of them came
  from the compilation cache."""
  found = WARMED_UP.search(log.read_text(errors="replace"))
  if found is None:
    return None
  return {"warmup_s": float(found[1]), "compiles": int(found[2]),
          "cache_hits": int(found[3])}
