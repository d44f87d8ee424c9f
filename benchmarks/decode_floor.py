"""The whole decode step against its floor, per XLA:CPU setting.

python benchmarks/decode_floor.py [--rows 16,64 --repeats 5 --settings default,ynn_off,...]
python benchmarks/decode_floor.py --smoke   # default and ynn_off, 16 rows, 3 repeats

On SmolLM2-135M's shape (random weights, fp32, one CPU device) times, at 16
and 64 rows:
- the engine's decode step: `EngineCore`'s own jitted `engine_steps.decode_step`,
  a chunk of `chunk_steps` steps per call (`EngineCore._run_decode`, as the
  scheduler runs it, tokens read back at the end), divided by the steps, over
  a cache in the 256 + chunk bucket (264 slots) whose rows span 100 to 190
  slots (greedy, top-20 raw log-probabilities as always);
- its floor: the weight-matmul chain of `gemm_floor.py` (q, k, v, o, gate,
  up, down of the 30 layers) followed by the LM head [rows, 576] x
  [576, 49152], one jitted program, and the head alone.
The step / (chain + head) ratio is the step's overhead over its matmuls (the
target: at most 1.2 at 16 rows). Two more of the step's parts are timed alone
beside them: the 30 layers' dense decode attention over the same bucket
(`decode_attention.py`) and sampling with the top-20 raw log-probabilities.

XLA reads XLA_FLAGS once per process, so each setting runs in a process of
its own started by this run (`worker`, its flags appended to XLA_FLAGS before
JAX starts), all of them alive at once, and their parts are timed round-robin
across the settings (the machine idle `--settle` s before each call), so the
settings see the same machine load. The settings (flag values as this
jaxlib's XLA parses them):
- `default`: YNNPACK for each dot (`individual_dot`);
- `ynn_off`: `--xla_cpu_experimental_ynn_fusion_type=` (XLA's own dot emitters);
- `ynn_fusions`: YNNPACK dot and elementwise fusions besides single dots;
- `ynn_all`: the same plus reductions;
- `onednn_custom_call`: `--xla_cpu_use_onednn --xla_cpu_experimental_onednn_custom_call`
  (oneDNN matmul custom calls with fused epilogues), YNNPACK off;
- `onednn_fusion`: `--xla_cpu_experimental_onednn_fusion_type=dot,eltwise`, YNNPACK off;
- `xnn_fusion`: `--xla_cpu_experimental_xnn_fusion_type=dot,eltwise`, YNNPACK off.
Each worker counts the library calls in its compiled decode step (YNNPACK
fusions, oneDNN and XNNPACK calls, from XLA's dump of the optimised program)
and fingerprints that program: a setting whose step compiles to the same
program as an earlier setting's (a flag this jaxlib does not act on) is
reported as such and not timed again. It also returns the step's greedy
tokens and log-probabilities, compared with the default setting's (the
weights are the same NumPy draws in every process). Writes
benchmarks/results/decode_floor.json and the table in docs/results.md.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import pathlib
import re
import tempfile
import time

import common

common.setup_cpu_process()

YNN = "--xla_cpu_experimental_ynn_fusion_type="
SETTINGS = {
    "default": "",
    "ynn_off": YNN,
    "ynn_fusions": YNN + "individual_dot,dot,eltwise",
    "ynn_all": YNN + "individual_dot,dot,eltwise,reduce",
    "onednn_custom_call": ("--xla_cpu_use_onednn=true"
                           " --xla_cpu_experimental_onednn_custom_call=true " + YNN),
    "onednn_fusion": "--xla_cpu_experimental_onednn_fusion_type=dot,eltwise " + YNN,
    "xnn_fusion": "--xla_cpu_experimental_xnn_fusion_type=dot,eltwise " + YNN,
}
SLOTS, CHUNK, LONGEST = 264, 8, 190
LIBRARY_CALLS = {"ynn": r"__ynn_fusion", "onednn": r"onednn", "xnn": r"__xnn"}


def _random_model(cfg, seed: int = 0):
  """A Decoder with every matrix drawn by NumPy (N(0, 0.02)) and unit norm weights, so
  every child process holds the same weights whatever its XLA flags."""
  import jax
  import numpy as np
  from flax import nnx

  from helpsteer_jax.models.decoder import Decoder
  model = Decoder(cfg, rngs=nnx.Rngs(seed))
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(seed)
  leaves, tree = jax.tree.flatten(state)
  drawn = [(rng.standard_normal(a.shape, np.float32) * 0.02 if a.ndim >= 2
            else np.ones(a.shape, np.float32)) for a in leaves]
  return nnx.merge(graphdef, jax.tree.unflatten(tree, jax.device_put(drawn)))


def _engine(cfg, rows: int):
  """An EngineCore over a random model whose cache holds random keys and values in the
  264-slot bucket, rows starting so that they span 100 to 190 slots."""
  import jax
  import numpy as np

  from helpsteer_jax import sharding
  from helpsteer_jax.inference.engine_core import EngineCore
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  core = EngineCore(_random_model(cfg), mesh, None, max_batch=rows, max_length=SLOTS - CHUNK,
                    chunk_steps=CHUNK)
  cache, rng = core.cache, np.random.default_rng(1)
  cache.resize(SLOTS, 0)
  cache.k, cache.v = ([[jax.device_put(rng.standard_normal(b.shape, np.float32), cache.sharding)
                        for b in layer] for layer in buffers] for buffers in (cache.k, cache.v))
  spans = rng.integers(100, LONGEST + 1, rows).astype(np.int32)
  spans[0] = LONGEST
  cache.end = LONGEST
  cache.row_start[:] = cache.end - spans
  core.positions[:] = spans
  core.last[:] = rng.integers(3, cfg.vocab_size, rows)
  core.seeds[:] = np.arange(rows, dtype=np.uint32)
  return core


def _floor(cfg, rows: int):
  """(chain + head, head alone): callables on [rows, hidden]."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from gemm_floor import chain, shapes

  rng = np.random.default_rng(2)
  ws = jax.device_put([[(rng.standard_normal(s, np.float32) * 0.02).T for s in shapes(cfg)]
                       for _ in range(cfg.num_layers)])
  head = jax.device_put(rng.standard_normal((cfg.hidden_size, cfg.vocab_size), np.float32)
                        * 0.02)
  linear = lambda x, w: jnp.einsum("mh,hn->mn", x, w, preferred_element_type=jnp.float32)
  both = jax.jit(lambda x, ws, head: linear(chain(x, ws, linear, jax.nn.silu), head))
  alone = jax.jit(linear)
  x = jnp.full((rows, cfg.hidden_size), 0.01, jnp.float32)
  return (lambda: both(x, ws, head).block_until_ready(),
          lambda: alone(x, head).block_until_ready())


def _parts(cfg, rows: int) -> dict:
  """Two of the step's other parts alone: the 30 layers' dense decode attention over the
  same bucket and spans (`decode_attention.py`'s inputs), and sampling with the top-20 raw
  log-probabilities from [rows, vocab] logits."""
  import jax
  import numpy as np
  from decode_attention import _inputs, _stack

  from helpsteer_jax.inference import sampling
  from helpsteer_jax.models import attention
  q, ks, vs, info, first = _inputs(cfg, rows, SLOTS, LONGEST, cfg.num_layers)
  dense = lambda q, k, v, info, first: attention.cached_attention(q, k, v, info)
  attend = jax.jit(functools.partial(_stack, dense))
  logits = jax.device_put(np.random.default_rng(3).standard_normal((rows, cfg.vocab_size),
                                                                    np.float32))
  keys = jax.random.split(jax.random.key(0), rows)
  zeros, ones = np.zeros(rows, np.float32), np.ones(rows, np.float32)

  def sample(logits, keys):
    new, logp = sampling.sample_rows(logits, keys, zeros, ones, np.zeros(rows, np.int32))
    return new, logp, sampling.raw_logprobs(logits, new)

  sample = jax.jit(sample)
  return {"attention": lambda: attend(q, ks, vs, info, first).block_until_ready(),
          "sampling": lambda: jax.block_until_ready(sample(logits, keys))}


def _step_program(dump: pathlib.Path) -> str:
  """The optimised HLO of the decode step among the programs XLA dumped."""
  files = sorted(dump.glob("*decode_step*after_optimizations.txt"), key=lambda f: f.stat().st_size)
  return files[-1].read_text() if files else ""


def worker(conn, flags: str, model: str, rows: int, dump: str) -> None:
  """One setting in its own process: XLA_FLAGS are set before JAX starts. Sends the
  step's greedy tokens and log-probabilities, its library calls and a fingerprint of its
  compiled program, then times one named part per request (`common.Worker`'s protocol,
  with the part's name)."""
  os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={dump} --xla_dump_hlo_as_text".strip()
  import numpy as np

  from helpsteer_jax.models import catalog
  cfg = catalog.model_config(model)
  core = _engine(cfg, rows)
  tokens, logprobs, _ = core._run_decode(rows)  # compiles; the checked tokens
  both, head = _floor(cfg, rows)
  fns = {"step_chunk": functools.partial(core._run_decode, rows), "chain_head": both,
         "head": head, **_parts(cfg, rows)}
  for fn in fns.values():
    fn()
  program = _step_program(pathlib.Path(dump))
  conn.send({"tokens": np.asarray(tokens).tolist(), "logprobs": np.asarray(logprobs).tolist(),
             "library_calls": {k: len(re.findall(p, program, re.I))
                               for k, p in LIBRARY_CALLS.items()},
             "program": hashlib.sha256(re.sub(r"HloModule \S+", "", program).encode()
                                       ).hexdigest()[:12]})
  while (name := conn.recv()) is not None:
    start = time.perf_counter()
    fns[name]()
    conn.send(time.perf_counter() - start)


class Setting:
  """A running `worker` process for one setting."""

  def __init__(self, name: str, model: str, rows: int, tmp: str):
    import multiprocessing as mp
    flags = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), SETTINGS[name]) if f)
    self.conn, child = mp.get_context("spawn").Pipe()
    self.proc = mp.get_context("spawn").Process(
        target=worker, args=(child, flags, model, rows, f"{tmp}/{name}-{rows}"), daemon=True)
    self.proc.start()
    self.info = self.conn.recv()

  def run(self, part: str) -> float:
    self.conn.send(part)
    return self.conn.recv()

  def stop(self) -> None:
    self.conn.send(None)
    self.proc.join(timeout=60)


PARTS = ("step_chunk", "chain_head", "head", "attention", "sampling")


def measure(names: list[str], model: str, rows: int, repeats: int, settle: float) -> dict:
  """Every setting's parts at `rows` rows, timed round-robin across the settings' processes
  (one part at a time, the machine left idle `settle` s before each); a setting whose
  compiled step equals an earlier one's is not timed again."""
  out, running = {}, {}
  with tempfile.TemporaryDirectory() as tmp:
    try:
      for name in names:
        setting = Setting(name, model, rows, tmp)
        same = next((n for n, s in running.items()
                     if s.info["program"] == setting.info["program"]), None)
        out[name] = {k: v for k, v in setting.info.items()}
        if same is not None:
          out[name]["same_program_as"] = same
          setting.stop()
        else:
          running[name] = setting
      times = {(n, p): [] for n in running for p in PARTS}
      for _ in range(repeats):
        for name, setting in running.items():
          for part in PARTS:
            time.sleep(settle)
            times[name, part].append(setting.run(part))
    finally:
      for setting in running.values():
        setting.stop()
  for name in running:
    ms = {p: 1e3 * common.median(times[name, p]) for p in PARTS}
    ms["step"] = ms.pop("step_chunk") / CHUNK
    out[name]["ms"] = {k: round(v, 2) for k, v in ms.items()}
    out[name]["step_over_floor"] = round(ms["step"] / ms["chain_head"], 3)
  return out


def _agreement(got: dict, want: dict) -> dict:
  import numpy as np
  tokens = np.asarray(got["tokens"]) == np.asarray(want["tokens"])
  diff = np.abs(np.asarray(got["logprobs"]) - np.asarray(want["logprobs"]))
  return {"greedy_tokens_equal": round(float(tokens.mean()), 4),
          "max_logprob_diff": float(diff[tokens].max(initial=0.0))}


def _table_row(name: str, rows: int, r: dict) -> list[str]:
  calls = " / ".join(str(r["library_calls"][k]) for k in LIBRARY_CALLS)
  tokens = f"{100 * r['greedy_tokens_equal']:.0f}%"
  if "ms" not in r:
    return [name, str(rows), f"same program as {r['same_program_as']}", "", "", "", "", "",
            tokens, calls]
  ms = r["ms"]
  return [name, str(rows), f"{ms['step']:.1f}", f"{ms['chain_head']:.1f}", f"{ms['head']:.1f}",
          f"{r['step_over_floor']:.2f}", f"{ms['attention']:.1f}", f"{ms['sampling']:.1f}",
          tokens, calls]


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--model", default="smollm2_135m")
  parser.add_argument("--rows", default="16,64")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--settle", type=float, default=0.5)
  parser.add_argument("--settings", default=",".join(SETTINGS))
  parser.add_argument("--smoke", action="store_true")
  args = parser.parse_args()
  if args.smoke:
    args.rows, args.repeats, args.settings = "16", 3, "default,ynn_off"
  names = ["default"] + [n for n in args.settings.split(",") if n != "default"]
  results = {}
  for rows in (int(r) for r in args.rows.split(",")):
    results[rows] = measure(names, args.model, rows, args.repeats, args.settle)
    for name, r in results[rows].items():
      r.update(_agreement(r, results[rows]["default"]))
      print(rows, name, {k: v for k, v in r.items() if k not in ("tokens", "logprobs")},
            flush=True)
  for r in (r for by_name in results.values() for r in by_name.values()):
    del r["tokens"], r["logprobs"]

  import jax
  common.write_result("decode_floor", {
      "benchmark": "decode_floor", "model": args.model, "dtype": "float32", "slots": SLOTS,
      "longest_row": LONGEST, "chunk_steps": CHUNK, "repeats": args.repeats,
      "flags": {n: SETTINGS[n] for n in names}, "jax": jax.__version__,
      "machine": common.machine(), "results": results})
  common.update_doc_table(
      "decode-floor",
      ["setting", "rows", "step ms", "chain + head ms", "head ms", "step / (chain + head)",
       "attention x30 ms", "sampling ms", "greedy tokens equal",
       "YNNPACK / oneDNN / XNNPACK calls in the step"],
      [_table_row(name, rows, r) for rows, by_name in results.items()
       for name, r in by_name.items()])


if __name__ == "__main__":
  main()
