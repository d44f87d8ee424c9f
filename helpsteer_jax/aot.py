"""Ahead-of-time compilation of a task's train step for a TPU topology.

`--config.compile_only=True --config.compile_topology=v5p-128` builds
compile-only TPU devices through libtpu (no TPU attached), lays the task's
real train step out on them with the production mesh and shardings, lowers
and compiles it on abstract inputs, and reports per-device memory
(arguments, outputs, temporaries) against the chip's HBM with a verdict, and
the compiled FLOPs per step. Topologies are accelerator names
(`v4-128`, `v5p-256`, `v5e-256`, `v6e-64`: the number counts TensorCores
for v4 / v5p, chips for v5e / v6e) or libtpu topology strings (`v5e:2x2`,
`v5p:4x4x4`); `compile_slices=N` makes N such slices (multi-slice).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import pathlib
import re
import time
from typing import Any, Callable

import ml_collections
from absl import logging

from helpsteer_jax import runtime, unrollable
from helpsteer_jax.errors import ConfigError

GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Generation:
  libtpu_name: str
  hbm_bytes: int        # per chip, from Cloud TPU's system architecture pages
  cores_per_chip: int   # TensorCores per chip (the v4 / v5p names count cores)
  torus_dims: int
  peak_bf16_flops: float    # per chip
  hbm_bytes_per_second: float  # per chip


GENERATIONS = {
    "v4": Generation("v4", 32 * GIB, 2, 3, 275e12, 1228e9),
    "v5e": Generation("v5e", 16 * GIB, 1, 2, 197e12, 819e9),
    "v5p": Generation("v5p", 95 * GIB, 2, 3, 459e12, 2765e9),
    "v6e": Generation("v6e", 32 * GIB, 1, 2, 918e12, 1640e9),
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e", "trillium": "v6e"}


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str            # as given, e.g. v5p-128
  generation: str      # v4 | v5e | v5p | v6e
  shape: tuple[int, ...]  # chips per slice along each torus dimension
  slices: int = 1

  @property
  def chips(self) -> int:
    return math.prod(self.shape) * self.slices

  @property
  def libtpu_name(self) -> str:
    return f"{GENERATIONS[self.generation].libtpu_name}:{'x'.join(map(str, self.shape))}"

  @property
  def hbm_bytes(self) -> int:
    return GENERATIONS[self.generation].hbm_bytes

  @property
  def wrap(self) -> tuple[bool, bool, bool]:
    """Wraparound links per torus dimension, as the real slice has them: v4 / v5p slices
    of whole 4x4x4 cubes are 3D tori; a v5e / v6e side of a full pod's 16 chips wraps.

    libtpu's compile-only topology has none unless told, and XLA:TPU then compiles an
    FSDP all-gather on a 4x4x4 slice as a dynamic-update-slice into zeros plus a
    full-size all-reduce, where the real slice gets a native all-gather.
    """
    if len(self.shape) == 3:
      return (all(d % 4 == 0 for d in self.shape),) * 3
    return (*(d == 16 for d in self.shape), False)


def slice_shape(chips: int, dims: int) -> tuple[int, ...]:
  """The standard slice shape of `chips` chips (v5p-128 -> 4x4x4, v5e-256 -> 16x16)."""
  if chips < 1 or chips & (chips - 1):
    raise ConfigError(f"a TPU slice has a power-of-two number of chips, not {chips}")
  shape = [2, 2, 1] if dims == 3 and chips >= 4 else [1] * dims
  while math.prod(shape) < chips:
    smallest = min(shape)
    i = max(j for j, s in enumerate(shape) if s == smallest)
    shape[i] *= 2
  if math.prod(shape) != chips:
    raise ConfigError(f"no standard {dims}D slice has {chips} chips")
  return tuple(shape)


def parse_topology(name: str, slices: int = 1) -> Topology:
  """`v5p-128` / `v5e-256` / `v5e:2x2` / `v5p:4x4x4` -> `Topology`."""
  if slices < 1:
    raise ConfigError(f"compile_slices={slices} must be at least 1")
  text = name.strip().lower()
  m = re.fullmatch(r"([a-z0-9]+?)(?:pod)?-(\d+)", text) or re.fullmatch(
      r"([a-z0-9]+?)(?:pod)?[:=_](\d+(?:x\d+)*)", text)
  gen = _ALIASES.get(m.group(1), m.group(1)) if m else None
  if gen not in GENERATIONS:
    raise ConfigError(
        f"compile_topology={name!r} is not a TPU topology; use an accelerator name such as"
        f" v4-128, v5p-128, v5e-256, v6e-256 or a libtpu topology such as v5e:2x2 or"
        f" v5p:4x4x4 (generations: {', '.join(GENERATIONS)})")
  g = GENERATIONS[gen]
  if "x" in m.group(2) or ":" in text or "=" in text or "_" in text:
    shape = tuple(int(x) for x in m.group(2).split("x"))
  else:
    count = int(m.group(2))
    if count % g.cores_per_chip:
      raise ConfigError(f"{name}: {gen} names count TensorCores ({g.cores_per_chip} per chip)")
    shape = slice_shape(count // g.cores_per_chip, g.torus_dims)
  return Topology(name, gen, shape, slices)


def compile_only_devices(topology: Topology, log_dir: str | pathlib.Path) -> list:
  """Compile-only devices of `topology` from libtpu (no TPU needed)."""
  os.environ.setdefault("TPU_LOG_DIR", str(log_dir))
  # The devices are never run on: another process may hold the TPU lock.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies
  try:
    desc = topologies.get_topology_desc(topology.libtpu_name, "tpu",
                                        num_slices=topology.slices, wrap=topology.wrap)
  except Exception as e:  # libtpu missing or a topology it does not know
    raise ConfigError(f"cannot build compile-only devices for {topology.libtpu_name}"
                      f" x{topology.slices}: {e}; install the tpu extra"
                      " (pip install -e '.[tpu]')") from None
  return list(desc.devices)


def memory_report(stats: Any, hbm_bytes: int) -> dict[str, Any]:
  """Per-device bytes from `compiled.memory_analysis()` and the HBM verdict.

  Temporaries are the peak less the live arguments and outputs when XLA
  reports a peak: libtpu 0.0.42 (jax 0.10.2) and 0.0.50 count the heap's
  fragmentation twice in `temp_size_in_bytes` (heap + fragmentation; the
  compiler's own log and libtpu 0.0.52 give the heap), while the peak agrees
  across versions. XLA's figure is kept as `temporaries_xla`.
  """
  arguments = int(stats.argument_size_in_bytes)
  outputs = int(stats.output_size_in_bytes)
  aliased = int(stats.alias_size_in_bytes)  # donated state: outputs reuse arguments
  temps_xla = int(stats.temp_size_in_bytes)
  code = int(stats.generated_code_size_in_bytes)
  resident = arguments + outputs - aliased
  peak = int(getattr(stats, "peak_memory_in_bytes", 0) or 0)
  temps = min(temps_xla, peak - resident) if peak > resident else temps_xla
  total = resident + temps + code
  return dict(arguments=arguments, outputs=outputs, aliased=aliased, temporaries=temps,
              temporaries_xla=temps_xla, generated_code=code, total=total, hbm=hbm_bytes,
              fits=total <= hbm_bytes)


_OOM = re.compile(r"Used ([\d.]+)([KMGT]) of ([\d.]+)([KMGT]) hbm")
# The other form: temporaries alone exceed HBM (arguments not counted in it).
_OOM_TEMPS = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT])\)")


def oom_report(message: str, hbm_bytes: int) -> dict[str, Any] | None:
  """The memory figures of XLA:TPU's out-of-memory compile error, if it is one."""
  if "RESOURCE_EXHAUSTED" not in message and "Ran out of memory" not in message:
    return None
  scale = {"K": 1024, "M": 1024 ** 2, "G": GIB, "T": 1024 * GIB}
  m = _OOM.search(message)
  total = int(float(m.group(1)) * scale[m.group(2)]) if m else None
  t = _OOM_TEMPS.search(message)
  temporaries = int(float(t.group(1)) * scale[t.group(2)]) if t else None
  report = dict(arguments=None, outputs=None, aliased=None, temporaries=temporaries,
                generated_code=None, total=total, hbm=hbm_bytes, fits=False,
                compile_error=message.splitlines()[0][:300])
  if total is None and temporaries is not None:  # a lower bound: arguments not included
    report.update(total=temporaries, total_is_lower_bound=True)
  return report


def compile_step(spec, hbm_bytes: int) -> dict[str, Any]:
  """Lowers and compiles `spec`; memory per device, verdict, XLA's FLOPs."""
  start = time.perf_counter()
  try:
    compiled = spec.lower().compile()
  except Exception as e:  # XLA:TPU refuses programs that exceed HBM
    report = oom_report(str(e), hbm_bytes)
    if report is None:
      raise
    report["compile_seconds"] = time.perf_counter() - start
    return report
  report = memory_report(compiled.memory_analysis(), hbm_bytes)
  report["compile_seconds"] = time.perf_counter() - start
  report["xla_flops_per_device"] = compiled_cost(compiled)["flops"]
  return report


def compiled_cost(compiled) -> dict[str, float]:
  """Per-device `flops` and `bytes_accessed` from XLA's cost analysis (loop bodies once)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  cost = cost or {}
  return {"flops": float(cost.get("flops", 0.0)),
          "bytes_accessed": float(cost.get("bytes accessed", 0.0))}


def extrapolate_layers(one: dict[str, float], two: dict[str, float], num_layers: int,
                       repeats: int = 1) -> dict[str, float]:
  """Whole-step costs from compiles of 1 and 2 layers: the second layer's increment
  times the remaining layers, all `repeats` times (micro-batches)."""
  return {k: repeats * (one[k] + (num_layers - 1) * (two[k] - one[k])) for k in one}


# XLA:TPU may turn an all-gather + matmul (or a matmul + reduce-scatter) into a loop over
# the shards that overlaps the collective with partial matmuls (a windowed einsum). The
# FLOPs are the same, but the cost analysis counts a loop body once, so the compiles that
# are only analysed for cost keep the plain collective and matmul.
COST_ANALYSIS_TPU_OPTIONS = {
    "xla_tpu_enable_windowed_einsum_for_all_gather": False,
    "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False,
}


def cost_analysis_compile(lowered, platform: str):
  """`lowered` compiled for `compiled_cost`: every loop XLA adds for overlap left out."""
  return lowered.compile(compiler_options=COST_ANALYSIS_TPU_OPTIONS if platform == "tpu"
                         else None)


def unrolled_cost_per_step(config: ml_collections.ConfigDict, make_spec: Callable,
                           num_layers: int) -> dict[str, float]:
  """Compiled FLOPs and bytes accessed of a whole step, all devices, every loop counted.

  XLA's cost analysis counts a loop body once, and unrolling 80 layers and
  every micro-batch would make the compile itself the bottleneck. So the
  step is compiled with loops unrolled for 1 and 2 layers and one
  micro-batch, and extrapolated linearly (layers, then micro-batches; the
  optimizer update, ~1e-4 of the step, is thereby counted per micro-batch),
  without windowed einsums (`COST_ANALYSIS_TPU_OPTIONS`).
  """
  per = []
  for layers in (1, 2):
    cfg = copy.deepcopy(config)
    with cfg.unlocked():
      cfg.model.num_layers = layers
      cfg.train.global_batch = cfg.train.micro_batch
    with unrollable.unrolled_for_analysis():
      spec = make_spec(cfg)
      compiled = cost_analysis_compile(spec.lower(),
                                       spec.rt.mesh.devices.flat[0].platform)
    per.append({k: v * spec.rt.mesh.size for k, v in compiled_cost(compiled).items()})
  accum = config.train.global_batch // config.train.micro_batch
  return extrapolate_layers(per[0], per[1], num_layers, accum)


def roofline_seconds(flops_per_device: float, bytes_per_device: float,
                     generation: str) -> dict[str, float]:
  """A step's lower bound on one chip: compute-bound and HBM-bound times, and the larger."""
  g = GENERATIONS[generation]
  compute = flops_per_device / g.peak_bf16_flops
  memory = bytes_per_device / g.hbm_bytes_per_second
  return {"compute_seconds": compute, "hbm_seconds": memory,
          "step_seconds": max(compute, memory)}


def analyze(config: ml_collections.ConfigDict, topology: Topology, devices: list,
            flops: bool = True) -> dict[str, Any]:
  """Compiles `config`'s train step on `devices`; the report as a dict."""
  from helpsteer_jax import tasks
  task = tasks.get_task(config.task)
  if not hasattr(task, "abstract_train_step"):
    raise ConfigError(f"task {config.task!r} has no compile-only train step"
                      " (abstract_train_step); compile_only supports training tasks")

  step_runtime = getattr(task, "compile_runtime", runtime.setup)  # RL's splits the devices

  def make_spec(cfg):
    return task.abstract_train_step(cfg, step_runtime(cfg, devices))

  spec = make_spec(config)
  model_cfg = runtime.model_config(config, weights=False)
  mem = compile_step(spec, topology.hbm_bytes)
  report = dict(
      task=config.task, topology=topology.name, libtpu_topology=topology.libtpu_name,
      slices=topology.slices, chips=len(devices), device_kind=devices[0].device_kind,
      mesh=dict(spec.rt.mesh.shape), model=config.model.name, params=spec.num_params,
      remat_policy=model_cfg.remat_policy, attention_impl=model_cfg.attention_impl,
      seq_len=config.train.seq_len, global_batch=config.train.global_batch,
      micro_batch=config.train.micro_batch,
      per_device_batch=config.train.micro_batch / _batch_shards(spec.rt),
      tokens_per_step=spec.tokens_per_step,
      analytic_flops_per_step=spec.analytic_flops_per_step, memory=mem)
  if spec.resident_bytes:  # included in the arguments above
    report["resident_bytes"] = dict(spec.resident_bytes)
  if spec.rollout_bytes:  # on the other devices: not in the step's memory
    report["rollout_bytes"] = dict(spec.rollout_bytes)
  if flops and mem["fits"]:
    cost = unrolled_cost_per_step(config, make_spec, model_cfg.num_layers)
    report["compiled_flops_per_step"] = cost["flops"]
    report["compiled_bytes_accessed_per_step"] = cost["bytes_accessed"]
    chips = len(devices)
    report["step_seconds_at_100pct_mfu"] = cost["flops"] / (
        GENERATIONS[topology.generation].peak_bf16_flops * chips)
    report["roofline"] = roofline_seconds(cost["flops"] / chips,
                                          cost["bytes_accessed"] / chips, topology.generation)
  return report


def _batch_shards(rt) -> int:
  from helpsteer_jax import sharding as sharding_lib
  spec = sharding_lib.logical_to_spec(("batch",), rt.rules)
  return sharding_lib.spec_shard_count(spec, rt.mesh, 0)


def _gib(n: int | None) -> str:
  if n is None:
    return "?"
  return f"{n / GIB:.2f} GiB" if n >= GIB // 4 else f"{n / 1024 ** 2:.2f} MiB"


def format_report(r: dict[str, Any]) -> str:
  """The human-readable summary printed by compile-only runs."""
  m = r["memory"]
  lines = [
      f"{r['task']} step, {r['model']} ({r['params'] / 1e9:.2f}B params), compiled for"
      f" {r['topology']} ({r['libtpu_topology']} x{r['slices']}, {r['chips']} x"
      f" {r['device_kind']}), mesh {r['mesh']}",
      f"  seq {r['seq_len']}, global batch {r['global_batch']}, micro-batch"
      f" {r['micro_batch']} ({r['per_device_batch']:g} per device), remat"
      f" {r['remat_policy']}, attention {r['attention_impl']}",
      "  per-device memory:",
      f"    arguments    {_gib(m['arguments'])}",
      f"    outputs      {_gib(m['outputs'])} ({_gib(m['aliased'])} aliased to donated arguments)",
      f"    temporaries  {_gib(m['temporaries'])}" + (
          f" (at the peak; XLA's temp size {_gib(m['temporaries_xla'])})"
          if m.get("temporaries_xla", m["temporaries"]) != m["temporaries"] else ""),
      f"    total        {_gib(m['total'])} of {_gib(m['hbm'])} HBM ->"
      f" {'FITS' if m['fits'] else 'DOES NOT FIT'}",
  ]
  if m.get("compile_error"):
    lines.append(f"    XLA: {m['compile_error']}")
  if r.get("resident_bytes"):
    lines.append("    of the arguments, resident beside the step: " + ", ".join(
        f"{name} {_gib(n)}" for name, n in r["resident_bytes"].items()))
  if r.get("rollout_bytes"):
    side = dict(r["rollout_bytes"])
    n = side.pop("devices")
    lines.append(f"  on the {n} rollout devices, each (decode temporaries apart): " + ", ".join(
        f"{name} {_gib(b)}" for name, b in side.items()) + f"; total {_gib(sum(side.values()))}")
  if "compiled_flops_per_step" in r:
    lines.append(f"  FLOPs per step: {r['compiled_flops_per_step']:.4g} compiled,"
                 f" {r['analytic_flops_per_step']:.4g} analytic; at 100% MFU a step takes"
                 f" {r['step_seconds_at_100pct_mfu']:.3g} s")
  if "roofline" in r:
    rl = r["roofline"]
    lines.append(f"  bytes accessed per step: {r['compiled_bytes_accessed_per_step']:.4g};"
                 f" roofline {rl['step_seconds']:.3g} s a step (compute {rl['compute_seconds']:.3g}"
                 f" s, HBM {rl['hbm_seconds']:.3g} s)")
  return "\n".join(lines)


def run(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> dict[str, Any]:
  """The `compile_only=True` entry: compile, print, write `aot_<topology>.json`."""
  if not config.get("compile_topology"):
    raise ConfigError("compile_only=True needs --config.compile_topology, e.g. v5p-128,"
                      " v5e-256 or v5e:2x2")
  workdir = pathlib.Path(workdir)
  runtime.check_workdir(workdir)
  topology = parse_topology(config.compile_topology, int(config.get("compile_slices", 1)))
  devices = compile_only_devices(topology, workdir / "tpu_logs")
  logging.info("compile-only: %d %s devices", len(devices), devices[0].device_kind)
  report = analyze(config, topology, devices, flops=bool(config.get("compile_flops", True)))
  name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"aot_{topology.name}x{topology.slices}.json")
  (workdir / name).write_text(json.dumps(report, indent=2))
  print(format_report(report))
  print(f"report: {workdir / name}")
  return report
