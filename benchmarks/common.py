"""Shared pieces of the benchmark scripts: environment, timing, reporting.

Each benchmark runs JAX and PyTorch in the same process, interleaving their
timed repetitions so both see the same machine load, and reports medians.
Results go to `benchmarks/results/<name>.json` and to a marked table in
docs/results.md (the install sizes: docs/install.md).
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import re
import statistics
import sys
import time
from typing import Callable

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
RESULTS_DOC = REPO / "docs" / "results.md"  # the benchmark tables
INSTALL_DOC = REPO / "docs" / "install.md"  # the install-sizes table


def setup_cpu_process() -> None:
  """Re-exec with THP-backed malloc, pin to CPU, quiet TPU probing."""
  sys.path.insert(0, str(REPO))
  from helpsteer_jax import cpu_env
  cpu_env.reexec_with_malloc_tunables()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TPU_LOG_DIR", str(REPO / ".tpu_logs"))


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
  """Runs each callable once per round, round after round; seconds per call."""
  times: dict[str, list[float]] = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
  return times


def median(xs: list[float]) -> float:
  return statistics.median(xs)


def cpu_kind(cpuinfo: str | None = None) -> str:
  """The vector extensions XLA:CPU compiles for, which decide the last bits of float
  reductions: "AVX-512 (avx512f, avx512bw, ...)" with the flags /proc/cpuinfo lists,
  else "AVX2", else the machine's architecture."""
  if cpuinfo is None:
    path = pathlib.Path("/proc/cpuinfo")
    cpuinfo = path.read_text() if path.exists() else ""
  flags: set[str] = set()
  for line in cpuinfo.splitlines():
    if line.startswith("flags"):
      flags.update(line.split(":", 1)[1].split())
  avx512 = sorted(f for f in flags if f.startswith("avx512"))
  if avx512:
    return f"AVX-512 ({', '.join(avx512)})"
  return "AVX2" if "avx2" in flags else platform.machine()


def machine() -> dict:
  import jax
  try:
    import torch
  except ImportError:  # the demo figures need none
    torch = None
  return {
      "cpu": platform.processor() or platform.machine(),
      "cpu_kind": cpu_kind(),
      "cores": os.cpu_count(),
      "jax": jax.__version__,
      "torch": torch.__version__ if torch else None,
      "torch_threads": torch.get_num_threads() if torch else None,
      "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
      "date": time.strftime("%Y-%m-%d"),
  }


def write_result(name: str, result: dict) -> pathlib.Path:
  RESULTS.mkdir(parents=True, exist_ok=True)
  path = RESULTS / f"{name}.json"
  path.write_text(json.dumps(result, indent=2) + "\n")
  print(json.dumps(result, indent=2))
  return path


def _marked(marker: str) -> re.Pattern:
  return re.compile(rf"<!-- {re.escape(marker)} -->\n?(.*?)<!-- /{re.escape(marker)} -->", re.S)


def update_doc_table(marker: str, header: list[str], rows: list[list[str]],
                     doc: pathlib.Path = RESULTS_DOC, caption: str = "") -> None:
  """Replaces the table between `<!-- marker -->` and `<!-- /marker -->` in `doc`
  (with a caption line before it when given)."""
  text = doc.read_text()
  lines = ([caption, ""] if caption else []) + ["| " + " | ".join(header) + " |",
                                                "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  block = f"<!-- {marker} -->\n" + "\n".join(lines) + f"\n<!-- /{marker} -->"
  pattern = _marked(marker)
  if not pattern.search(text):
    name = doc.relative_to(REPO) if doc.is_relative_to(REPO) else doc
    raise SystemExit(f"{name} has no <!-- {marker} --> section to update")
  doc.write_text(pattern.sub(lambda _: block, text))


def read_doc_table(marker: str, doc: pathlib.Path = RESULTS_DOC
                   ) -> tuple[str, list[str], list[list[str]]] | None:
  """(caption, header, rows) of the table between `doc`'s `marker` lines (the caption:
  the text before the table, joined); None when `doc` has no such section."""
  found = _marked(marker).search(doc.read_text())
  if found is None:
    return None
  caption, table = [], []
  for line in found.group(1).splitlines():
    if line.startswith("|"):
      table.append([c.strip() for c in line.strip().strip("|").split("|")])
    elif line.strip() and not table:
      caption.append(line.strip())
  return " ".join(caption), (table[0] if table else []), table[2:]  # [1]: the |---| line


class Worker:
  """A benchmark subject in its own process (own threads, own peak memory).

  `target(conn, *args)` builds its model, sends "ready", then answers "run"
  with the seconds one timed call took and "stats" with a dict (it should
  include `peak_rss_mb`), until "stop".
  """

  def __init__(self, target, *args):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    self.conn, child = ctx.Pipe()
    self.proc = ctx.Process(target=target, args=(child, *args), daemon=True)
    self.proc.start()
    message = self.conn.recv()
    if message != "ready":
      raise RuntimeError(f"benchmark worker failed to start: {message}")

  def run(self) -> float:
    self.conn.send("run")
    return self.conn.recv()

  def stats(self) -> dict:
    self.conn.send("stats")
    return self.conn.recv()

  def stop(self) -> None:
    self.conn.send("stop")
    self.proc.join(timeout=60)


def serve(conn, run_once, stats=lambda: {}) -> None:
  """The worker side of `Worker`: a timed call per "run"."""
  import resource
  usage = {"cpu_user_s": [], "cpu_sys_s": [], "page_faults": []}
  conn.send("ready")
  while True:
    command = conn.recv()
    if command == "run":
      before = resource.getrusage(resource.RUSAGE_SELF)
      start = time.perf_counter()
      run_once()
      conn.send(time.perf_counter() - start)
      after = resource.getrusage(resource.RUSAGE_SELF)
      usage["cpu_user_s"].append(round(after.ru_utime - before.ru_utime, 3))
      usage["cpu_sys_s"].append(round(after.ru_stime - before.ru_stime, 3))
      usage["page_faults"].append(after.ru_minflt - before.ru_minflt)
    elif command == "stats":
      peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      conn.send({"peak_rss_mb": round(peak_kb / 1024, 1), "usage_per_run": usage, **stats()})
    else:
      return


def interleaved_worker_times(workers: dict[str, "Worker"], repeats: int,
                             settle_seconds: float = 2.0,
                             untimed_before: int = 0) -> dict[str, list[float]]:
  """Seconds per timed call of each worker, round after round.

  Before each call the machine is left idle for `settle_seconds`: the
  worker that ran last keeps its thread pool spinning for a while after its
  call (OpenMP and Eigen both spin-wait), and on a 2-core machine that
  spinning would be charged to whichever worker runs next.

  `untimed_before` calls run back to back just before each timed call, so
  it is timed as in a training loop, on memory the previous call has just
  used. A worker that waits through the other's turn has its freed memory
  returned to the host (virtio-balloon free page reporting on VMs), and its
  next call page-faults the whole working set back in.
  """
  times: dict[str, list[float]] = {name: [] for name in workers}
  for _ in range(repeats):
    for name, worker in workers.items():
      time.sleep(settle_seconds)
      for _ in range(untimed_before):
        worker.run()
      times[name].append(worker.run())
  return times


def run_workers(workers: dict[str, "Worker"], repeats: int
                ) -> tuple[dict[str, list[float]], dict[str, dict]]:
  """Two warm-up calls each, then `interleaved_worker_times` (an untimed call before
  each timed one); (times, stats) of every worker, which is stopped at the end."""
  try:
    for w in workers.values():  # compile / warm up
      w.run()
      w.run()
    times = interleaved_worker_times(workers, repeats, untimed_before=1)
    return times, {name: w.stats() for name, w in workers.items()}
  finally:
    for w in workers.values():
      w.stop()


def bench_train_config(hf_dir: str, batch: int, seq: int, *, lr: float, betas, weight_decay: float,
                       clip: float, data=None, **model_knobs):
  """The training config of the step benchmarks: bench_100m from `hf_dir` on one device,
  one micro-batch of `batch` rows per step, constant-lr AdamW, no export or saves."""
  from helpsteer_jax import config_base, config_sections
  from helpsteer_jax.config_sections import optimizer_config
  config = config_base.base_config("bench")
  config.model = config_base.model_section("bench_100m", **model_knobs)
  config.init.source = hf_dir
  config.data = data if data is not None else config_base.data_config()
  config.mesh = config_base.mesh_config(1, 1, 1)
  config.train = config_sections.train_config(num_steps=1000, global_batch=batch, micro_batch=batch,
                                   seq_len=seq, export_hf=False, loss_chunk_size=256,
                                   save_every=10**9)
  config.optimizer = optimizer_config(lr=lr, b1=betas[0], b2=betas[1], weight_decay=weight_decay,
                                      grad_clip=clip, schedule="constant", warmup_steps=0)
  return config


def hf_llama_config(name: str = "bench_100m", **overrides):
  """A transformers LlamaConfig with the same shape as one of our named models
  (models/catalog.py)."""
  import transformers

  from helpsteer_jax.models import catalog
  cfg = catalog.model_config(name)
  return cfg, transformers.LlamaConfig(
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
      intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
      max_position_embeddings=4096, **overrides)


def torch_adamw(model, lr: float, betas: tuple[float, float], weight_decay: float):
  """torch AdamW with no decay on norm weights (as our optimizer's mask)."""
  import torch
  decay = [p for n, p in model.named_parameters() if "norm" not in n]
  no_decay = [p for n, p in model.named_parameters() if "norm" in n]
  return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                            {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas,
                           eps=1e-8)


def torch_sft_step(model, opt, params, inputs, labels, clip: float) -> float:
  """One PyTorch step of next-token cross-entropy (fp32 logits), clipping and AdamW."""
  import torch
  opt.zero_grad(set_to_none=True)
  logits = model(input_ids=inputs).logits
  loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                           labels.reshape(-1))
  loss.backward()
  torch.nn.utils.clip_grad_norm_(params, clip)
  opt.step()
  return float(loss)


def bench_model_pair(attention: str, name: str = "bench_100m"):
  """(ModelConfig, transformers model, our model) with identical random weights."""
  import tempfile

  import torch
  import transformers

  from helpsteer_jax.models import hf
  torch.manual_seed(0)
  cfg, hf_cfg = hf_llama_config(name, attn_implementation="sdpa")
  pt_model = transformers.LlamaForCausalLM(hf_cfg).eval()
  with tempfile.TemporaryDirectory() as tmp:
    pt_model.save_pretrained(tmp)
    model = hf.load_hf_model(tmp, attention_impl=attention)
  return cfg, pt_model, model
