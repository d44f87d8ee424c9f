"""HF checkpoint import: our loader vs transformers' `from_pretrained`.

python benchmarks/hf_import.py [--repeats 5] [--table-only]

Saves a ~250M-parameter fp32 Llama (about 1 GB, random weights, several
safetensors files) with transformers into a temporary directory, then
imports it, alternating the subjects round after round, each import in a
fresh process of its own (so peak memory and I/O counters do not mix and
every import pays its one-off costs, as a real one does):

- ours, `hf.load_hf_state` onto 1 device, and onto an 8-device (fsdp=8)
  CPU mesh (one process: it still reads every tensor once);
- ours in 2 processes of 4 devices (jax.distributed, fsdp=8 across them),
  each reading only its devices' blocks; process 1 reads a copy of the
  checkpoint, so that each has a page cache of its own as on two hosts;
- `transformers.AutoModelForCausalLM.from_pretrained(dir, dtype=float32)`,
  which (transformers 5) leaves fp32 weights mapped to the files: they are
  read when first touched, so "until resident" adds reading one float of
  every 4 KiB page of every weight.

Each subject runs with the checkpoint's files read into the page cache just
before ("warm") and with their pages evicted ("cold",
`posix_fadvise(DONTNEED)` on each file: the system-wide drop_caches is not
writable here). Reported (medians): wall time of the import call and until
every weight is in memory, bytes our reader served, `/proc/self/io`
read_bytes (fetched from the disk by this process) and rchar (bytes through
read syscalls: both libraries mmap the files, so it stays small), peak RSS
(VmHWM, file-backed pages included; `ru_maxrss` would report the parent's
peak, which survives fork and exec) and the RSS before the import. Writes
benchmarks/results/hf_import.json and the table in docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import common

common.setup_cpu_process()

# subject -> (processes, devices per process)
SUBJECTS = {"ours_1_device": (1, 1), "ours_8_devices": (1, 8), "ours_2_processes": (2, 4),
            "transformers": (1, 1)}
HF_CONFIG = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                 num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4,
                 max_position_embeddings=4096, tie_word_embeddings=False)


def _io() -> dict[str, int]:
  with open("/proc/self/io") as f:
    return {k: int(v) for k, v in (line.split(": ") for line in f if line.strip())}


def _status_mb(field: str) -> float:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def set_cache(directory: str, cold: bool) -> None:
  """Drops the checkpoint files' pages from the page cache, or reads them in."""
  for name in os.listdir(directory):
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
      continue
    if not cold:
      with open(path, "rb") as f:
        while f.read(1 << 24):
          pass
      continue
    fd = os.open(path, os.O_RDONLY)
    try:
      os.fsync(fd)  # dirty pages cannot be dropped
      os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
      os.close(fd)


def child(subject: str, directory: str, process: int, port: int) -> None:
  """One import (one process of it); prints a JSON line of what it measured."""
  import numpy as np
  if subject == "transformers":
    import torch
    import transformers

    def load():
      return transformers.AutoModelForCausalLM.from_pretrained(
          directory, dtype=torch.float32), None

    def touch(model):
      # The weights stay mapped to the files: read one float per 4 KiB page.
      with torch.no_grad():
        for p in model.parameters():
          float(p.view(-1)[::1024].sum())

    def checks(model):
      params = {n: p.detach().numpy() for n, p in model.named_parameters()}
      return [params["model.embed_tokens.weight"],
              params["model.layers.15.mlp.down_proj.weight"].T.copy()]
  else:
    import jax
    from flax import nnx
    processes, devices = SUBJECTS[subject]
    if processes > 1:
      jax.distributed.initialize(f"localhost:{port}", processes, process)

    from helpsteer_jax import sharding
    from helpsteer_jax.models import hf
    from helpsteer_jax.models import safetensors_io as st
    mesh = sharding.make_mesh((1, processes * devices, 1))

    def load():
      reader = st.CheckpointReader(directory)
      model = nnx.merge(*hf.load_hf_state(directory, hf.config_from_hf(directory), mesh,
                                          reader=reader))
      jax.block_until_ready(nnx.state(model))
      return model, reader.bytes_read

    def touch(model):
      del model  # the import leaves every weight in device buffers

    def checks(model):
      if processes > 1:  # the weights are not all on this process
        return []
      return [np.asarray(model.embed[...]), np.asarray(model.layers.mlp.down_proj[15])]

  rss_before = _status_mb("VmRSS")
  io_before = _io()
  start = time.perf_counter()
  model, served = load()
  loaded = time.perf_counter()
  touch(model)
  resident = time.perf_counter()
  io_after = _io()
  print(json.dumps({
      "seconds": loaded - start, "seconds_resident": resident - start,
      "served_bytes": served,
      "read_bytes": io_after["read_bytes"] - io_before["read_bytes"],
      "rchar": io_after["rchar"] - io_before["rchar"],
      "rss_before_mb": round(rss_before, 1),
      "peak_rss_mb": round(_status_mb("VmHWM"), 1),
      "checksum": [float(np.sum(c, dtype=np.float64)) for c in checks(model)]}))


def run_child(subject: str, directories: list[str], cold: bool) -> list[dict]:
  """One import by `subject`: what each of its processes measured."""
  processes, devices = SUBJECTS[subject]
  for directory in directories:
    set_cache(directory, cold)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  port = str(_free_port())
  procs = [subprocess.Popen([sys.executable, __file__, "--child", subject, "--dir",
                             directories[p], "--process", str(p), "--port", port],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for p in range(processes)]
  out = []
  for proc in procs:
    stdout, stderr = proc.communicate()
    if proc.returncode:
      raise SystemExit(f"{subject} failed:\n{stderr[-4000:]}")
    out.append(json.loads(stdout.strip().splitlines()[-1]))
  return out


def _free_port() -> int:
  import socket
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def summarize(runs: list[list[dict]]) -> dict:
  """Medians over the runs; a run of several processes counts its slowest
  process's time and its largest figures."""
  keys = ("seconds", "seconds_resident", "read_bytes", "rchar", "rss_before_mb",
          "peak_rss_mb")
  worst = [{k: max(p[k] for p in run) for k in keys} for run in runs]
  out = {k: common.median([w[k] for w in worst]) for k in keys}
  out["seconds"] = round(out["seconds"], 2)
  out["seconds_resident"] = round(out["seconds_resident"], 2)
  out["served_bytes"] = runs[0][0]["served_bytes"]
  out["served_bytes_per_process"] = [p["served_bytes"] for p in runs[0]]
  out["read_bytes_per_process"] = [[p["read_bytes"] for p in run] for run in runs]
  out["seconds_each"] = [round(w["seconds"], 2) for w in worst]
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--child")
  parser.add_argument("--dir")
  parser.add_argument("--process", type=int, default=0)
  parser.add_argument("--port", type=int, default=0)
  parser.add_argument("--table-only", "--readme-only", dest="table_only", action="store_true",
                      help="rebuild the docs/results.md table from"
                      " benchmarks/results/hf_import.json")
  args = parser.parse_args()
  if args.child:
    child(args.child, args.dir, args.process, args.port)
    return
  if args.table_only:
    update_table(json.loads((common.RESULTS / "hf_import.json").read_text()))
    return

  import torch
  import transformers
  torch.manual_seed(0)
  with tempfile.TemporaryDirectory() as directory:
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_CONFIG))
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(directory, max_shard_size="300MB")
    del model
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    size = sum(os.path.getsize(os.path.join(directory, f)) for f in files)
    copy = os.path.join(directory, "copy")  # the second "host"'s disk
    shutil.copytree(directory, copy, ignore=shutil.ignore_patterns("copy"))
    runs: dict[str, dict[str, list[list[dict]]]] = {"warm": {}, "cold": {}}
    load = [os.getloadavg()[0]]  # other jobs on the machine show here
    for _ in range(args.repeats):
      for cache in runs:
        for subject in SUBJECTS:
          runs[cache].setdefault(subject, []).append(
              run_child(subject, [directory, copy], cold=cache == "cold"))
          load.append(os.getloadavg()[0])
  checksums = {s: r[0][0]["checksum"] for s, r in runs["warm"].items()
               if SUBJECTS[s][0] == 1}
  assert all(c == checksums["transformers"] for c in checksums.values()), checksums
  result = {
      "benchmark": "hf_import", "params": params, "dtype": "float32",
      "checkpoint_bytes": size, "files": len(files), "repeats": args.repeats,
      "load_average_1min": [round(x, 2) for x in load],
      "results": {cache: {s: summarize(r) for s, r in by.items()} for cache, by in runs.items()},
      "runs": runs, "machine": common.machine(),
  }
  common.write_result("hf_import", result)
  update_table(result)


def update_table(result: dict) -> None:
  """The docs/results.md table from a result (also `--table-only`, from the saved JSON)."""
  names = {"ours_1_device": "helpsteer-jax, 1 device",
           "ours_8_devices": "helpsteer-jax, 8-device fsdp mesh",
           "ours_2_processes": "helpsteer-jax, 2 processes x 4 devices, fsdp=8 (per process)",
           "transformers": "transformers `from_pretrained`"}
  gb = result["checkpoint_bytes"] / 1e9
  rows = []
  for cache, by in result["results"].items():
    for subject, r in by.items():
      served = "-" if r["served_bytes"] is None else f"{r['served_bytes'] / 1e9:.2f}"
      rows.append([f"Llama {result['params'] / 1e6:.0f}M fp32, {gb:.2f} GB", cache,
                   names[subject], f"{r['seconds']:.2f}", f"{r['seconds_resident']:.2f}",
                   served, f"{r['read_bytes'] / 1e9:.2f}",
                   f"{r['peak_rss_mb'] / 1024:.2f} ({r['rss_before_mb'] / 1024:.2f})"])
  common.update_doc_table(
      "hf-import-benchmark",
      ["checkpoint", "page cache", "import", "call s", "until resident s",
       "GB served by reader", "GB read from disk", "peak RSS GB (before)"], rows)


if __name__ == "__main__":
  main()
