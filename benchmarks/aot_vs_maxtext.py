"""Our AC-SFT train step next to MaxText's, compiled ahead of time for the same TPU slices.

MaxText needs Python >= 3.12; both sides compile in one process of one
environment, so they share jax, XLA and libtpu:

  python3.12 -m venv .venv-maxtext
  .venv-maxtext/bin/pip install 'maxtext[tpu]' -e .
  .venv-maxtext/bin/python benchmarks/aot_vs_maxtext.py [--cases llama3_8b@v5p-8]

Each case compiles both train steps for libtpu's compile-only devices of one
topology with the same work: sequence length 4096, one row per device and no
gradient accumulation, full remat (each layer keeps only its input), bf16
compute, fp32 master weights and AdamW moments, splash attention with
512-blocks, every device on the fsdp axis. Per side it records XLA's
per-device memory of the full-depth step (arguments, outputs aliased to
donated arguments, temporaries), the compiled FLOPs and bytes accessed of a
whole step (compiles of 1 and 2 unrolled layers, extrapolated to all layers,
as `helpsteer_jax.aot` does: XLA counts a loop body once; those compiles also
turn off XLA:TPU's windowed einsums, loops over the shards that would
otherwise be counted once too), and a roofline
step time from the chip's peak bf16 FLOP/s and HBM bandwidth. Neither count
includes the splash kernels' own work (Pallas calls are opaque to XLA's cost
analysis), the same kernels on both sides. Results accumulate in
benchmarks/results/aot_vs_maxtext.json (a rerun skips finished compiles) and
go to the table in docs/results.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import runpy
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TPU_LOG_DIR", str(REPO / ".tpu_logs"))
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile-only: no TPU is locked
# MaxText's train_compile.py sets these for its compiles; both sides get them.
os.environ["LIBTPU_INIT_ARGS"] = (os.environ.get("LIBTPU_INIT_ARGS", "")
                                  + " --xla_tpu_spmd_rng_bit_generator_unsafe=true")

RESULTS = REPO / "benchmarks" / "results" / "aot_vs_maxtext.json"
SEQ_LEN = 4096
BLOCK = 512


@dataclasses.dataclass(frozen=True)
class Case:
  preset: str      # configs/acsft.py preset (also the model's name)
  maxtext: str     # MaxText model_name
  topology: str

  @property
  def key(self) -> str:
    return f"{self.preset}@{self.topology}"


CASES = (Case("llama3_8b", "llama3-8b", "v5p-8"), Case("llama2_70b", "llama2-70b", "v5p-128"),
         Case("llama2_70b", "llama2-70b", "v5p-64"), Case("llama2_70b", "llama2-70b", "v6e-256"))


def load() -> dict:
  return json.loads(RESULTS.read_text()) if RESULTS.exists() else {"cases": {}}


def save(results: dict) -> None:
  RESULTS.parent.mkdir(parents=True, exist_ok=True)
  tmp = RESULTS.with_suffix(".tmp")
  tmp.write_text(json.dumps(results, indent=2) + "\n")
  tmp.replace(RESULTS)


# ---- ours -------------------------------------------------------------------------------

def our_config(case: Case, chips: int):
  from helpsteer_jax import config_base
  config = runpy.run_path(str(REPO / "configs" / "acsft.py"))["get_config"](case.preset)
  config.model.update(remat_policy="full", attention_impl="splash", attention_block_size=BLOCK,
                      dtype="bfloat16", param_dtype="float32")
  config.init.source = ""
  config.mesh = config_base.mesh_config(data=1, fsdp=-1, tensor=1)
  config.train.update(seq_len=SEQ_LEN, global_batch=chips, micro_batch=chips)
  return config


def ours(case: Case) -> dict:
  from helpsteer_jax import aot
  topo = aot.parse_topology(case.topology)
  devices = aot.compile_only_devices(topo, REPO / ".tpu_logs")
  config = our_config(case, len(devices))
  report = aot.analyze(config, topo, devices, flops=True)
  return {"memory": report["memory"], "flops_per_step": report.get("compiled_flops_per_step"),
          "bytes_accessed_per_step": report.get("compiled_bytes_accessed_per_step"),
          "chips": len(devices), "mesh": report["mesh"], "params": report["params"],
          "settings": {"remat": "full (jax.checkpoint of each layer, nothing saved)",
                       "attention": f"splash, block {BLOCK}",
                       "loss_chunk_size": config.train.get("loss_chunk_size"),
                       "optimizer": "AdamW (optax), fp32 moments"}}


# ---- MaxText ----------------------------------------------------------------------------

def _maxtext_compiled(case: Case, workdir: str, layers: int = 0):
  """MaxText's own AOT path (train_compile.py's helpers) for `case`; `layers` > 0 compiles
  that many unscanned layers (for the cost analysis)."""
  import maxtext
  from flax.core.spmd import logical_axis_rules
  from maxtext.configs import pyconfig
  from maxtext.trainers.pre_train import train
  from maxtext.trainers.pre_train import train_compile as tc
  from maxtext.utils import maxtext_utils, sharding

  from helpsteer_jax import aot

  base = pathlib.Path(maxtext.__file__).parent / "configs" / "base.yml"
  argv = ["aot_vs_maxtext", str(base), f"model_name={case.maxtext}",
          f"compile_topology={case.topology}", "compile_topology_num_slices=1",
          f"max_target_length={SEQ_LEN}", "per_device_batch_size=1", "remat_policy=full",
          "weight_dtype=float32", "dtype=bfloat16", "opt_type=adamw",
          f"sa_block_q={BLOCK}", f"sa_block_kv={BLOCK}", f"sa_block_kv_compute={BLOCK}",
          f"sa_block_q_dkv={BLOCK}", f"sa_block_kv_dkv={BLOCK}",
          f"sa_block_kv_dkv_compute={BLOCK}", f"sa_block_q_dq={BLOCK}",
          f"sa_block_kv_dq={BLOCK}", "enable_checkpointing=false",
          f"base_output_directory={workdir}", "run_name=aot_vs_maxtext"]
  if layers:
    argv += ["scan_layers=false", f"base_num_decoder_layers={layers}",
             "override_model_config=true",
             "compile_xla_flags=" + " ".join(f"--{k}={str(v).lower()}" for k, v in
                                             aot.COST_ANALYSIS_TPU_OPTIONS.items())]
  config = pyconfig.initialize(argv)
  tc.validate_config(config)
  mesh = tc.get_topology_mesh(config)
  shaped_args, shaped_kwargs, state_shardings, _, model = tc.get_shaped_inputs(mesh, config)
  params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(
      config, state_shardings)
  input_shardings = sharding.build_zero1_input_state_mesh_shardings(
      config, state_shardings, params_shardings)
  data_sharding = sharding.get_input_data_sharding(config, mesh)
  func, in_shard, out_shard, static_argnums, donate_argnums = (
      maxtext_utils.get_functional_train_with_signature(
          train.train_step, data_sharding, input_shardings, model, config, params_shardings))
  compiled = tc.jit_and_compile(func, shaped_args, shaped_kwargs, mesh, in_shard, out_shard,
                                static_argnums, donate_argnums, config,
                                logical_axis_rules(config.logical_axis_rules))
  return compiled, config, mesh, shaped_args[0]


def theirs(case: Case) -> dict:
  import jax

  from helpsteer_jax import aot
  topo = aot.parse_topology(case.topology)
  with tempfile.TemporaryDirectory() as workdir:
    compiled, config, mesh, state = _maxtext_compiled(case, workdir)
    memory = aot.memory_report(compiled.memory_analysis(), topo.hbm_bytes)
    state_bytes = int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)))
    del compiled
    per = []
    for layers in (1, 2):
      small = _maxtext_compiled(case, workdir, layers)[0]
      per.append({k: v * mesh.size for k, v in aot.compiled_cost(small).items()})
    cost = aot.extrapolate_layers(per[0], per[1], config.base_num_decoder_layers)
  return {"memory": memory, "flops_per_step": cost["flops"],
          "bytes_accessed_per_step": cost["bytes_accessed"], "chips": int(mesh.size),
          "mesh": {k: int(v) for k, v in mesh.shape.items() if v > 1},
          "state_bytes": state_bytes,
          "settings": {"remat": config.remat_policy, "attention": config.attention,
                       "scan_layers": config.scan_layers, "packing": config.packing,
                       "optimizer": f"{config.opt_type}, mu {config.mu_dtype}",
                       "cast_logits_to_fp32": config.cast_logits_to_fp32}}


# ---- report -----------------------------------------------------------------------------

def with_roofline(side: dict, generation: str) -> dict:
  from helpsteer_jax import aot
  if side.get("flops_per_step"):
    side["roofline"] = aot.roofline_seconds(side["flops_per_step"] / side["chips"],
                                            side["bytes_accessed_per_step"] / side["chips"],
                                            generation)
  return side


def _gib(n) -> str:
  return "?" if n is None else f"{n / 2**30:.2f}"


def table_rows(results: dict) -> list[list[str]]:
  rows = []
  for key, sides in results["cases"].items():
    ref = sides.get("maxtext", {})
    for name, label in (("maxtext", "MaxText"), ("ours", "helpsteer-jax")):
      side = sides.get(name)
      if not side:
        continue
      m, rl = side["memory"], side.get("roofline", {})
      ratio = (f"{m['total'] / ref['memory']['total']:.2f}x" if ref and name == "ours"
               else "1.00x" if name == "maxtext" else "?")
      rows.append([key, label, _gib(m["arguments"]), _gib(m["temporaries"]), _gib(m["total"]),
                   ratio, f"{(side.get('flops_per_step') or 0) / 1e15:.3f}",
                   f"{(side.get('bytes_accessed_per_step') or 0) / 1e12:.2f}",
                   f"{rl.get('step_seconds', 0):.2f} ({rl.get('compute_seconds', 0):.2f} /"
                   f" {rl.get('hbm_seconds', 0):.2f})"])
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", default=",".join(c.key for c in CASES),
                      help="comma-separated preset@topology")
  parser.add_argument("--redo", default="", help="comma-separated preset@topology:side to rerun")
  args = parser.parse_args()
  import jax
  jax.config.update("jax_default_prng_impl", "unsafe_rbg")
  from helpsteer_jax import aot
  wanted = args.cases.split(",")
  redo = set(filter(None, args.redo.split(",")))
  results = load()
  for case in (c for c in CASES if c.key in wanted):
    sides = results["cases"].setdefault(case.key, {})
    for name, fn in (("maxtext", theirs), ("ours", ours)):
      if name in sides and f"{case.key}:{name}" not in redo:
        continue
      start = time.time()
      side = fn(case)
      side["wall_seconds"] = round(time.time() - start, 1)
      sides[name] = with_roofline(side, aot.parse_topology(case.topology).generation)
      save(results)
      print(f"{case.key} {name}: total {_gib(side['memory']['total'])} GiB, temporaries"
            f" {_gib(side['memory']['temporaries'])} GiB, {side['wall_seconds']} s", flush=True)
  results["machine"] = {"jax": jax.__version__, "date": time.strftime("%Y-%m-%d"),
                        "maxtext": _version("maxtext"), "libtpu": _version("libtpu")}
  save(results)
  sys.path.insert(0, str(REPO / "benchmarks"))
  import common
  common.update_doc_table(
      "aot-vs-maxtext", ["case", "step", "arguments GiB", "temporaries GiB", "total GiB",
                         "total vs MaxText", "PFLOP / step", "TB accessed / step",
                         "roofline s (compute / HBM)"], table_rows(results))


def _version(dist: str) -> str | None:
  from importlib import metadata
  try:
    return metadata.version(dist)
  except metadata.PackageNotFoundError:
    return None


if __name__ == "__main__":
  main()
