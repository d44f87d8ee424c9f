"""The server under a bounded mixed load: streams, disconnects, bad requests, memory.

python benchmarks/serve_load.py [--seconds 60 --clients 32 --max-tokens 64]

A configs/serve.py server on the demo `tiny` shape (random weights, demo
tokenizer, one CPU device, 16 rows) takes `--clients` concurrent clients for
`--seconds`, each sending, at random: a streamed chat (50%), a non-streamed
chat (20%), a stream it leaves after the first chunk (10%), a non-streamed
request it gives up on after 0.1 s (10%), or a malformed body (10%). Reports
requests/s, generated tokens/s, p50 / p99 latency of the finished requests,
the status codes (no 5xx expected), rows cancelled, busy rows and queue after
the load (0 expected), the server's RSS before and after, and whether a
greedy answer is the same before and after. Writes
benchmarks/results/serve_load.json and the table in docs/results.md.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import random
import tempfile
import time

import common

common.setup_cpu_process()

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import serve  # noqa: E402  (the server start of benchmarks/serve.py)

from helpsteer_jax.data.demo import tokenizer as demo_tokenizer  # noqa: E402
from helpsteer_jax.models import builder, catalog, hf  # noqa: E402

KINDS = (("stream", 0.5), ("plain", 0.2), ("stream_left", 0.1), ("plain_left", 0.1),
         ("malformed", 0.1))
BAD_BODIES = ('{"model": "bench", "messages": [{"role": "user", "content": "a\\ud800"}]}',
              '{"model": "bench", "messages": [], "max_tokens": ' + "9" * 5000 + "}",
              '{"model": "bench", "messages": [{"role": "user", "content": "hi"}],'
              ' "temperature": NaN}', "{not json", "[" * 50_000)


def _chat(prompt: str, max_tokens: int, stream: bool) -> dict:
  return {"model": "bench", "messages": [{"role": "user", "content": prompt}],
          "max_tokens": max_tokens, "temperature": 0, "stream": stream}


def one_request(client: httpx.Client, kind: str, prompt: str, max_tokens: int) -> dict:
  """Sends one request of `kind`; its status, tokens and seconds (None when left)."""
  start = time.perf_counter()
  if kind == "malformed":
    r = client.post("/v1/chat/completions", content=random.choice(BAD_BODIES))
    return {"status": r.status_code, "tokens": 0, "seconds": time.perf_counter() - start}
  if kind.startswith("stream"):
    tokens = 0
    with client.stream("POST", "/v1/chat/completions",
                       json=_chat(prompt, max_tokens, True)) as r:
      for line in r.iter_lines():
        if kind == "stream_left" and line.startswith("data: "):
          return {"status": r.status_code, "tokens": 0, "seconds": None}
        if line.startswith("data: {"):
          tokens += 1  # chunks, about one per token
    return {"status": r.status_code, "tokens": tokens, "seconds": time.perf_counter() - start}
  timeout = 0.1 if kind == "plain_left" else 120
  try:
    r = client.post("/v1/chat/completions", json=_chat(prompt, max_tokens, False),
                    timeout=timeout)
  except httpx.TimeoutException:
    return {"status": "left", "tokens": 0, "seconds": None}
  tokens = r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
  return {"status": r.status_code, "tokens": tokens, "seconds": time.perf_counter() - start}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--seconds", type=float, default=60)
  parser.add_argument("--clients", type=int, default=32)
  parser.add_argument("--max-tokens", type=int, default=64)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    tok = demo_tokenizer.build_demo_tokenizer(f"{tmp}/tok")
    hf.save_hf_model(builder.create(catalog.model_config("tiny"), seed=0), f"{tmp}/hf",
                     dtype="float32", tokenizer=str(tok))
    port = serve.free_port()
    proc = serve._start(f"{tmp}/hf", port, max_batch=16)
    base = f"http://127.0.0.1:{port}"
    try:
      server = psutil.Process(proc.pid)
      probe = _chat("Name three rivers.", args.max_tokens, False)
      greedy_before = httpx.post(f"{base}/v1/chat/completions", json=probe, timeout=120).json()
      rss_before = server.memory_info().rss
      stats_before = httpx.get(f"{base}/stats").json()
      deadline = time.perf_counter() + args.seconds
      weights = [w for _, w in KINDS]

      def client_loop(seed: int) -> list[dict]:
        rng, out = random.Random(seed), []
        with httpx.Client(base_url=base, timeout=120,
                          headers={"Content-Type": "application/json"}) as client:
          while time.perf_counter() < deadline:
            kind = rng.choices([k for k, _ in KINDS], weights)[0]
            prompt = f"Tell me {rng.randint(1, 9)} facts about {rng.choice(serve.TOPICS)}."
            out.append({"kind": kind, **one_request(client, kind, prompt, args.max_tokens)})
        return out

      start = time.perf_counter()
      with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        results = [r for rs in pool.map(client_loop, range(args.clients)) for r in rs]
      seconds = time.perf_counter() - start
      settle = time.perf_counter() + 30
      while (stats := httpx.get(f"{base}/stats").json())["busy_rows"] and (
          time.perf_counter() < settle):
        time.sleep(0.2)
      rss_after = server.memory_info().rss
      greedy_after = httpx.post(f"{base}/v1/chat/completions", json=probe, timeout=120).json()
    finally:
      proc.terminate()
      proc.wait(120)
  done = [r for r in results if r["seconds"] is not None and r["kind"] in ("stream", "plain")]
  latencies = np.asarray([r["seconds"] for r in done])
  statuses = collections.Counter(str(r["status"]) for r in results)
  row = {
      "clients": args.clients, "seconds": round(seconds, 1), "requests": len(results),
      "requests_per_s": round(len(results) / seconds, 1),
      "finished_generations": len(done),
      "tokens_per_s": round(sum(r["tokens"] for r in done) / seconds, 1),
      "p50_latency_s": round(float(np.percentile(latencies, 50)), 3),
      "p99_latency_s": round(float(np.percentile(latencies, 99)), 3),
      "kinds": dict(collections.Counter(r["kind"] for r in results)),
      "statuses": dict(statuses),
      "server_errors": sum(n for s, n in statuses.items() if s.startswith("5")),
      "cancelled_rows": stats["cancelled"] - stats_before["cancelled"],
      "busy_rows_after": stats["busy_rows"], "waiting_after": stats["waiting"],
      "compiles_during_load": stats["compiles"] - stats_before["compiles"],
      "rss_mb_before": round(rss_before / 2**20), "rss_mb_after": round(rss_after / 2**20),
      "greedy_same_after": (greedy_before["choices"][0]["message"]["content"]
                            == greedy_after["choices"][0]["message"]["content"]),
  }
  print(json.dumps(row), flush=True)
  common.write_result("serve_load", {"benchmark": "serve_load", "model": "demo tiny",
                                     "max_tokens": args.max_tokens,
                                     "machine": common.machine(), "results": [row]})
  common.update_doc_table(
      "serve-load",
      ["clients", "seconds", "requests/s", "tokens/s", "p50 / p99 latency (s)",
       "statuses", "5xx", "rows cancelled", "busy rows after", "RSS before / after (MB)",
       "greedy same after"],
      [[str(row["clients"]), str(row["seconds"]), str(row["requests_per_s"]),
        str(row["tokens_per_s"]), f"{row['p50_latency_s']} / {row['p99_latency_s']}",
        ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items())),
        str(row["server_errors"]), str(row["cancelled_rows"]), str(row["busy_rows_after"]),
        f"{row['rss_mb_before']} / {row['rss_mb_after']}",
        "yes" if row["greedy_same_after"] else "no"]])


if __name__ == "__main__":
  main()
