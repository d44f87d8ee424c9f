"""Server throughput: 32 concurrent chat requests vs the same requests one after another.

python benchmarks/serve.py [--models demo,bench_100m --requests 32 --max-tokens 64]

For each model (the demo `tiny` shape and the ~106M `bench_100m` Llama, random
weights saved as an HF directory with the demo tokenizer) a configs/serve.py
server runs in its own process on one CPU device; the official `openai`
client sends greedy chat requests with different prompts, first one after
another, then all at once. Reports generated tokens/s (usage.completion_tokens
over wall time) for both, their ratio, p50 / p99 latency of the concurrent
requests, and the compile count before and after (equal: no compile after
warm-up). Writes benchmarks/results/serve.json and the table in docs/results.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import socket
import subprocess
import sys
import tempfile
import time

import common

common.setup_cpu_process()

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import openai  # noqa: E402

from helpsteer_jax.data.demo import tokenizer as demo_tokenizer  # noqa: E402
from helpsteer_jax.models import builder, catalog, hf  # noqa: E402

TOPICS = ["rivers", "bread", "volcanoes", "chess", "owls", "glass", "tides", "maps"]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _prompts(n: int) -> list[str]:
  return [f"Tell me {i % 4 + 1} facts about {TOPICS[i % len(TOPICS)]}." for i in range(n)]


def _start(model_dir: str, port: int, max_batch: int) -> subprocess.Popen:
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  proc = subprocess.Popen(
      [sys.executable, "-m", "helpsteer_jax.main", "--config=configs/serve.py",
       f"--config.init.source={model_dir}", "--config.serve.model_name=bench",
       f"--config.serve.port={port}", "--config.serve.max_length=512",
       f"--config.serve.max_batch={max_batch}", f"--workdir={model_dir}/workdir"],
      cwd=common.REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 900
  while True:
    if proc.poll() is not None:
      raise RuntimeError(f"the server exited with {proc.returncode}")
    try:
      httpx.get(f"http://127.0.0.1:{port}/stats", timeout=5)
      return proc
    except httpx.TransportError:
      if time.time() > deadline:
        raise
      time.sleep(1)


def _ask(client: openai.OpenAI, prompt: str, max_tokens: int) -> tuple[int, float]:
  start = time.perf_counter()
  reply = client.chat.completions.create(
      model="bench", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
      temperature=0)
  return reply.usage.completion_tokens, time.perf_counter() - start


def bench(name: str, model: str, requests: int, max_tokens: int, max_batch: int) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    tok = demo_tokenizer.build_demo_tokenizer(f"{tmp}/tok")
    cfg = catalog.model_config(model)
    hf.save_hf_model(builder.create(cfg, seed=0), f"{tmp}/hf", dtype="float32", tokenizer=str(tok))
    port = free_port()
    proc = _start(f"{tmp}/hf", port, max_batch)
    try:
      base = f"http://127.0.0.1:{port}"
      client = openai.OpenAI(base_url=f"{base}/v1", api_key="-", max_retries=0, timeout=3600)
      prompts = _prompts(requests)
      _ask(client, prompts[0], 4)  # a first request off the clock
      compiles = httpx.get(f"{base}/stats").json()["compiles"]
      start = time.perf_counter()
      sequential = [_ask(client, p, max_tokens) for p in prompts]
      seq_seconds = time.perf_counter() - start
      with concurrent.futures.ThreadPoolExecutor(requests) as pool:
        start = time.perf_counter()
        concurrent_ = list(pool.map(lambda p: _ask(client, p, max_tokens), prompts))
        con_seconds = time.perf_counter() - start
      after = httpx.get(f"{base}/stats").json()["compiles"]
    finally:
      proc.terminate()
      proc.wait(120)
  seq_tokens = sum(t for t, _ in sequential)
  con_tokens = sum(t for t, _ in concurrent_)
  latencies = np.asarray([s for _, s in concurrent_])
  return {
      "model": name, "params": cfg.num_params(), "requests": requests, "max_tokens": max_tokens,
      "max_batch": max_batch,
      "sequential_tokens_per_s": seq_tokens / seq_seconds,
      "concurrent_tokens_per_s": con_tokens / con_seconds,
      "speedup": (con_tokens / con_seconds) / (seq_tokens / seq_seconds),
      "sequential_tokens": seq_tokens, "concurrent_tokens": con_tokens,
      "p50_latency_s": float(np.percentile(latencies, 50)),
      "p99_latency_s": float(np.percentile(latencies, 99)),
      "compiles_during_requests": after - compiles,
  }


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--models", default="demo,bench_100m")
  parser.add_argument("--requests", type=int, default=32)
  parser.add_argument("--max-tokens", type=int, default=64)
  parser.add_argument("--max-batch", type=int, default=16)
  args = parser.parse_args()
  model_of = {"demo": "tiny", "bench_100m": "bench_100m"}
  rows = [bench(m, model_of[m], args.requests, args.max_tokens, args.max_batch)
          for m in args.models.split(",")]
  common.write_result("serve", {"benchmark": "serve", "machine": common.machine(),
                                "results": rows})
  common.update_doc_table(
      "serve-benchmark",
      ["model", "requests", "max_tokens", "rows", "sequential tokens/s",
       "concurrent tokens/s", "speedup", "p50 / p99 latency (s)", "compiles during requests"],
      [[r["model"], str(r["requests"]), str(r["max_tokens"]), str(r["max_batch"]),
        f"{r['sequential_tokens_per_s']:.1f}", f"{r['concurrent_tokens_per_s']:.1f}",
        f"{r['speedup']:.2f}x", f"{r['p50_latency_s']:.1f} / {r['p99_latency_s']:.1f}",
        str(r["compiles_during_requests"])] for r in rows])


if __name__ == "__main__":
  main()
