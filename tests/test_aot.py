"""Ahead-of-time compilation for TPU topologies (compile-only devices from libtpu)."""

import json
import types

import pytest

from helpsteer_jax import aot
from helpsteer_jax.errors import ConfigError

from cli_utils import run_main

pytestmark = pytest.mark.version_tier  # libtpu's compiler and its JAX


@pytest.mark.parametrize("name, generation, shape", [
    ("v5p-128", "v5p", (4, 4, 4)), ("v5p-64", "v5p", (2, 4, 4)), ("v5p-256", "v5p", (4, 4, 8)),
    ("v4-8", "v4", (2, 2, 1)), ("v5e-256", "v5e", (16, 16)), ("v5litepod-16", "v5e", (4, 4)),
    ("v6e-64", "v6e", (8, 8)), ("v5e:2x2", "v5e", (2, 2)), ("v5p:2x2x2", "v5p", (2, 2, 2)),
])
def test_topology_names(name, generation, shape):
  topo = aot.parse_topology(name)
  assert (topo.generation, topo.shape) == (generation, shape)
  assert topo.libtpu_name == f"{generation}:{'x'.join(map(str, shape))}"


@pytest.mark.parametrize("name, wrap", [
    ("v5p-128", (True, True, True)), ("v5p-256", (True, True, True)),
    ("v5p-64", (False, False, False)), ("v5p-8", (False, False, False)),
    ("v4-128", (True, True, True)), ("v6e-256", (True, True, False)),
    ("v6e-128", (False, True, False)), ("v5e-64", (False, False, False)),
])
def test_wraparound_links_as_on_the_real_slice(name, wrap):
  """The reference is MaxText's accelerator_to_spec_map (Cloud TPU's slice shapes)."""
  assert aot.parse_topology(name).wrap == wrap


def test_a_4x4x4_slice_gathers_fsdp_weights_with_a_native_all_gather(tmp_path):
  """Without its wraparound links a compile-only v5p-128 turns an FSDP all-gather into a
  dynamic-update-slice into zeros + a full-size all-reduce (three times the HBM traffic);
  the real slice, and MaxText's compile-only one, gathers natively."""
  import jax
  import jax.numpy as jnp
  from jax.experimental import topologies
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from helpsteer_jax import sharding

  def gather_program(devices) -> str:
    mesh = sharding.make_mesh((1, len(devices), 1), devices)
    w = jax.ShapeDtypeStruct((8192, 28672), jnp.bfloat16,
                             sharding=NamedSharding(mesh, P("fsdp", None)))
    gather = jax.jit(lambda w: w * 2, out_shardings=NamedSharding(mesh, P()))
    return gather.lower(w).compile().as_text()

  topology = aot.parse_topology("v5p-128")
  text = gather_program(aot.compile_only_devices(topology, tmp_path / "tpu_logs"))
  assert " all-gather(" in text and " all-reduce(" not in text
  unwrapped = topologies.get_topology_desc(topology.libtpu_name, "tpu").devices
  text = gather_program(list(unwrapped))
  assert " all-gather(" not in text and " all-reduce(" in text  # what `wrap` fixes


def test_slices_and_bad_names():
  assert aot.parse_topology("v5e-256", slices=4).chips == 1024
  for bad in ("v7x-8", "v5p-100", "v5p-3", "tpu"):
    with pytest.raises(ConfigError, match="compile_topology|power-of-two|TensorCores"):
      aot.parse_topology(bad)


def test_memory_verdict_counts_donated_outputs_once():
  gib = aot.GIB
  stats = types.SimpleNamespace(argument_size_in_bytes=10 * gib, output_size_in_bytes=10 * gib,
                                alias_size_in_bytes=10 * gib, temp_size_in_bytes=5 * gib,
                                generated_code_size_in_bytes=0)
  report = aot.memory_report(stats, 16 * gib)
  assert report["total"] == 15 * gib and report["fits"]
  assert not aot.memory_report(stats, 14 * gib)["fits"]
  # libtpu's temp size counted fragmentation twice: the peak gives the temporaries.
  stats.peak_memory_in_bytes = 14 * gib
  report = aot.memory_report(stats, 16 * gib)
  assert report["temporaries"] == 4 * gib and report["temporaries_xla"] == 5 * gib
  assert report["total"] == 14 * gib
  oom = aot.oom_report("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory"
                       " in memory space hbm. Used 20.5G of 15.75G hbm. Exceeded hbm capacity"
                       " by 4.75G.", 16 * gib)
  assert oom["total"] == int(20.5 * gib) and not oom["fits"]
  temps = aot.oom_report("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory"
                         " required for HLO temporaries (103.27G) exceeds available HBM"
                         " (95.74G).", 95 * gib)
  assert temps["temporaries"] == int(103.27 * gib) and temps["total"] == temps["temporaries"]
  assert temps["total_is_lower_bound"] and "total_is_lower_bound" not in oom
  assert not temps["fits"]


def test_cost_extrapolation_and_roofline():
  """Whole-step costs from 1- and 2-layer compiles; the roofline takes the slower bound."""
  one, two = {"flops": 10.0, "bytes_accessed": 4.0}, {"flops": 16.0, "bytes_accessed": 7.0}
  assert aot.extrapolate_layers(one, two, 80, repeats=2) == {
      "flops": 2 * (10 + 79 * 6), "bytes_accessed": 2 * (4 + 79 * 3)}
  v5p = aot.GENERATIONS["v5p"]
  compute_bound = aot.roofline_seconds(2 * v5p.peak_bf16_flops, v5p.hbm_bytes_per_second, "v5p")
  assert compute_bound == {"compute_seconds": 2.0, "hbm_seconds": 1.0, "step_seconds": 2.0}
  hbm_bound = aot.roofline_seconds(v5p.peak_bf16_flops, 3 * v5p.hbm_bytes_per_second, "v5p")
  assert hbm_bound["step_seconds"] == hbm_bound["hbm_seconds"] == 3.0


def test_compile_only_acsft_step_for_v5e_2x2(tmp_path):
  proc = run_main("--config=configs/acsft.py", f"--workdir={tmp_path}",
                  "--config.compile_only=True", "--config.compile_topology=v5e:2x2",
                  "--config.model.num_layers=2", "--config.train.seq_len=128",
                  "--config.train.loss_chunk_size=64")
  report = json.loads((tmp_path / "aot_v5e_2x2x1.json").read_text())
  assert report["device_kind"] == "TPU v5 lite" and report["chips"] == 4
  assert report["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
  mem = report["memory"]
  assert mem["fits"] and mem["hbm"] == 16 * aot.GIB
  assert mem["total"] == (mem["arguments"] + mem["outputs"] - mem["aliased"]
                          + mem["temporaries"] + mem["generated_code"])
  # fp32 params + two Adam moments, sharded 4 ways, are the arguments' bulk.
  assert mem["arguments"] >= 3 * 4 * report["params"] / 4
  ratio = report["compiled_flops_per_step"] / report["analytic_flops_per_step"]
  assert 0.9 < ratio < 1.3, ratio
  roofline = report["roofline"]
  assert report["compiled_bytes_accessed_per_step"] > 0
  assert roofline["step_seconds"] == max(roofline["compute_seconds"], roofline["hbm_seconds"])
  assert roofline["compute_seconds"] == pytest.approx(report["step_seconds_at_100pct_mfu"])
  assert "FITS" in proc.stdout and "per-device memory" in proc.stdout
  assert "roofline" in proc.stdout
  assert not (tmp_path / "checkpoints").exists()


def test_compile_only_needs_a_topology(tmp_path):
  proc = run_main("--config=configs/acsft.py", f"--workdir={tmp_path}",
                  "--config.compile_only=True", check=False)
  assert proc.returncode == 2 and "compile_topology" in proc.stderr


@pytest.mark.parametrize("name, shape", [("v5p-256", (1, 64, 2)), ("v5e-256", (1, 128, 2)),
                                         ("v6e-256", (1, 64, 4))])
def test_meshes_that_split_a_physical_torus_axis(name, shape, tmp_path):
  """fsdp=64 on v5p-256's 4x4x8 torus is no product of whole axes: split one."""
  from helpsteer_jax import sharding
  devices = aot.compile_only_devices(aot.parse_topology(name), tmp_path / "tpu_logs")
  mesh = sharding.make_mesh(shape, devices)
  assert tuple(mesh.shape.values()) == shape
  assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)


def test_cost_analysis_counts_every_shard_of_a_windowed_einsum(tmp_path):
  """On v5p-64's 2x4x4 torus XLA:TPU splits an FSDP all-gather + matmul into a loop over
  the shards (a windowed einsum), and its cost analysis counts the loop body once. The
  compiles analysed for cost leave that loop out; the reference is 2*M*K*N per device."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  devices = aot.compile_only_devices(aot.parse_topology("v5p-64"), tmp_path / "tpu_logs")
  mesh = Mesh(np.array(devices), ("fsdp",))
  rows, hidden, mlp = 4096, 8192, 28672
  x = jax.ShapeDtypeStruct((len(devices) * rows, hidden), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P("fsdp", None)))
  w = jax.ShapeDtypeStruct((hidden, mlp), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P("fsdp", None)))
  lowered = jax.jit(lambda x, w: x @ w,
                    out_shardings=NamedSharding(mesh, P("fsdp", None))).lower(x, w)
  per_device = 2 * rows * hidden * mlp

  windowed = lowered.compile()
  assert " while(" in windowed.as_text()  # what the option guards against is still there
  assert aot.compiled_cost(windowed)["flops"] < 0.5 * per_device

  analysed = aot.cost_analysis_compile(lowered, "tpu")
  assert " while(" not in analysed.as_text()
  assert aot.compiled_cost(analysed)["flops"] == per_device
