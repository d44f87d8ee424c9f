"""Device mesh, logical-axis rules and sharding validation.

Parameters and key activations name their dimensions with logical axes
(`embed`, `vocab`, `heads`, ...). A rules table maps each logical axis to
mesh axes (`data`, `fsdp`, `tensor`). As in Flax's logical partitioning, a
mesh axis is used at most once per array: a later dimension whose mesh axes
are already taken stays replicated. With the default rules, pure data
parallelism, FSDP and FSDP + tensor parallelism differ only in mesh shape.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from typing import Any, Iterable, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from helpsteer_jax import config_base
from helpsteer_jax.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")

MeshAxes = str | tuple[str, ...] | None
Rules = tuple[tuple[str, MeshAxes], ...]

DEFAULT_RULES: Rules = config_base.DEFAULT_RULES


class ShardingConfigError(ConfigError):
  """A mesh / model / batch combination that cannot be sharded."""


def normalize_rules(rules: Iterable[Sequence[Any]]) -> Rules:
  """Turns config lists (e.g. `[["batch", ["data", "fsdp"]]]`) into `Rules`."""
  out = []
  for entry in rules:
    if len(entry) != 2:
      raise ShardingConfigError(
          f"A sharding rule must be (logical_axis, mesh_axes); got {entry!r}")
    name, axes = entry
    if isinstance(axes, (list, tuple)):
      axes = tuple(axes)
      for a in axes:
        if a not in MESH_AXES:
          raise ShardingConfigError(
              f"Rule {name!r} names mesh axis {a!r}; mesh axes are {MESH_AXES}")
    elif axes is not None and axes not in MESH_AXES:
      raise ShardingConfigError(
          f"Rule {name!r} names mesh axis {axes!r}; mesh axes are {MESH_AXES}")
    out.append((str(name), axes))
  return tuple(out)


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Fills in one `-1` entry with the remaining devices and checks the product."""
  shape = [int(s) for s in shape]
  if len(shape) != len(MESH_AXES):
    raise ShardingConfigError(
        f"mesh shape {tuple(shape)} must have {len(MESH_AXES)} entries"
        f" for axes {MESH_AXES}")
  if shape.count(-1) > 1:
    raise ShardingConfigError(
        f"mesh shape {tuple(shape)}: at most one axis may be -1")
  if any(s == 0 or s < -1 for s in shape):
    raise ShardingConfigError(
        f"mesh shape {tuple(shape)}: sizes must be positive or -1")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % known:
      raise ShardingConfigError(
          f"mesh shape {tuple(shape)}: {num_devices} devices are not divisible"
          f" by the fixed axes' product {known}; choose sizes whose product"
          f" divides {num_devices}")
    shape[shape.index(-1)] = num_devices // known
  if math.prod(shape) != num_devices:
    raise ShardingConfigError(
        f"mesh shape {dict(zip(MESH_AXES, shape))} uses {math.prod(shape)}"
        f" devices but {num_devices} are available; make the product of"
        f" data*fsdp*tensor equal {num_devices} (or set one axis to -1)")
  return tuple(shape)


def make_mesh(shape: Sequence[int], devices: Sequence[Any] | None = None) -> Mesh:
  """Builds the (data, fsdp, tensor) mesh with Auto axis types.

  On several TPU slices the `data` axis spans the slices (its gradient
  all-reduce is the only traffic over the data-centre network); fsdp and
  tensor stay within a slice's ICI.
  """
  devices = list(jax.devices() if devices is None else devices)
  resolved = resolve_mesh_shape(shape, len(devices))
  axis_types = (AxisType.Auto,) * len(MESH_AXES)
  slices = len({getattr(d, "slice_index", 0) for d in devices})
  if slices > 1:
    if resolved[0] % slices:
      raise ShardingConfigError(
          f"mesh {dict(zip(MESH_AXES, resolved))} on {slices} slices: mesh.data must be a"
          f" multiple of {slices} (data parallelism runs across slices); e.g."
          f" --config.mesh.data={slices} --config.mesh.fsdp=-1")
    from jax.experimental import mesh_utils
    ici = (resolved[0] // slices,) + tuple(resolved[1:])
    grid = mesh_utils.create_hybrid_device_mesh(ici, (slices, 1, 1), devices=devices,
                                                allow_split_physical_axes=True)
    return Mesh(grid, MESH_AXES, axis_types=axis_types)
  from jax.experimental import mesh_utils
  try:
    return jax.make_mesh(resolved, MESH_AXES, axis_types=axis_types, devices=devices)
  except NotImplementedError:
    # No whole physical axes multiply to an axis size (fsdp=64 on v5p-256's
    # 4x4x8 torus, fsdp=128 on a 16x16 v5e-256): split a physical axis.
    grid = mesh_utils.create_device_mesh(resolved, devices, allow_split_physical_axes=True)
  except AssertionError:
    # Part of a slice (RL's training or rollout devices, rl/off_policy.py): JAX's
    # topology-aware layout needs the whole torus, so the devices go in their order.
    grid = np.asarray(devices, dtype=object).reshape(resolved)
  return Mesh(grid, MESH_AXES, axis_types=axis_types)


def logical_to_spec(logical_axes: Sequence[str | None], rules: Rules) -> PartitionSpec:
  """Maps logical axis names to a `PartitionSpec` (first unused rule wins)."""
  table: dict[str, list[MeshAxes]] = {}
  for name, axes in rules:
    table.setdefault(name, []).append(axes)
  used: set[str] = set()
  spec = []
  for name in logical_axes:
    chosen = None
    for axes in table.get(name, []) if name is not None else []:
      flat = (axes,) if isinstance(axes, str) else tuple(axes or ())
      if not flat:
        break
      if not used.intersection(flat):
        chosen = axes if isinstance(axes, str) else tuple(flat)
        used.update(flat)
        break
    spec.append(chosen)
  return PartitionSpec(*spec)


def spec_shard_count(spec: PartitionSpec, mesh: Mesh, dim: int) -> int:
  entry = spec[dim] if dim < len(spec) else None
  if entry is None:
    return 1
  names = (entry,) if isinstance(entry, str) else entry
  return math.prod(mesh.shape[n] for n in names)


# ---------------------------------------------------------------------------
# The active rules, used by `constrain` inside model code.

_ACTIVE = threading.local()


@contextlib.contextmanager
def axis_rules(rules: Rules):
  """Makes `rules` the active logical-axis rules for activation constraints."""
  previous = getattr(_ACTIVE, "rules", None)
  _ACTIVE.rules = rules
  try:
    yield
  finally:
    _ACTIVE.rules = previous


def active_rules() -> Rules:
  return getattr(_ACTIVE, "rules", None) or DEFAULT_RULES


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
  """`with_sharding_constraint` by logical names; a no-op without a mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return x
  spec = logical_to_spec(logical_axes, active_rules())
  return jax.lax.with_sharding_constraint(x, spec)


# ---------------------------------------------------------------------------
# Validation before compiling.


@dataclasses.dataclass(frozen=True)
class ShardedArrayCheck:
  name: str
  shape: tuple[int, ...]
  logical_axes: tuple[str | None, ...]


def check_divisible(arrays: Iterable[ShardedArrayCheck], mesh: Mesh,
                    rules: Rules) -> None:
  """Raises `ShardingConfigError` naming every logical axis that cannot shard."""
  problems: dict[tuple, list[str]] = {}
  for arr in arrays:
    spec = logical_to_spec(arr.logical_axes, rules)
    for dim, size in enumerate(arr.shape):
      n = spec_shard_count(spec, mesh, dim)
      if size % n:
        key = (arr.logical_axes[dim], size, spec[dim], n)
        problems.setdefault(key, []).append(arr.name)
  if problems:
    lines = [
        f"{axis}={size} is not divisible by mesh axes {mesh_axes!r} ({n} shards),"
        f" e.g. in {names[0]}"
        for (axis, size, mesh_axes, n), names in problems.items()]
    raise ShardingConfigError(
        f"The mesh {dict(mesh.shape)} cannot shard this model:\n  - "
        + "\n  - ".join(lines)
        + "\nChoose mesh sizes that divide these dimensions (e.g. a tensor axis"
        " that divides num_heads and num_kv_heads; give the other devices to"
        " mesh.fsdp or mesh.data), or map the axis elsewhere in the sharding"
        " rules.")


def batch_spec(rules: Rules, ndim: int = 2) -> PartitionSpec:
  """Spec of a [batch, length, ...] input array."""
  return logical_to_spec(("batch", "length") + (None,) * (ndim - 2), rules)


def check_batch(global_batch: int, mesh: Mesh, rules: Rules, what: str = "batch") -> None:
  spec = logical_to_spec(("batch",), rules)
  n = spec_shard_count(spec, mesh, 0)
  if global_batch % n:
    raise ShardingConfigError(
        f"{what} size {global_batch} is not divisible by the {n} batch shards"
        f" (mesh axes {spec[0]} of {dict(mesh.shape)}); choose a multiple of"
        f" {n} or a smaller data/fsdp mesh")


def replicated_batch(rules: Rules) -> Rules:
  """`rules` with the batch axis on no mesh axis (for arrays of one row)."""
  return tuple((name, None if name == "batch" else axes) for name, axes in rules)


def named(mesh: Mesh, spec: PartitionSpec) -> NamedSharding:
  return NamedSharding(mesh, spec)


def describe_sharding(arr: jax.Array) -> str:
  sharding = arr.sharding
  spec = getattr(sharding, "spec", None)
  return f"{tuple(arr.shape)} {arr.dtype} {spec}"


def host_local_batch_slice(global_batch: int) -> slice:
  """The rows of a global batch that this process feeds (contiguous per host)."""
  per = global_batch // jax.process_count()
  start = jax.process_index() * per
  return slice(start, start + per)


def local_row_count(sharding: NamedSharding, rows: int, real_rows: int) -> int:
  """How many of the first `real_rows` of a [rows] array this process's devices hold."""
  held: set[int] = set()
  for index in sharding.addressable_devices_indices_map((rows,)).values():
    held.update(range(*index[0].indices(rows)))
  return sum(r < real_rows for r in held)


def to_global_array(local: np.ndarray, mesh: Mesh, spec: PartitionSpec) -> jax.Array:
  """Assembles a global array from each process's contiguous rows."""
  sharding = NamedSharding(mesh, spec)
  if jax.process_count() == 1:
    return jax.device_put(local, sharding)
  global_shape = (local.shape[0] * jax.process_count(),) + local.shape[1:]
  return jax.make_array_from_process_local_data(sharding, local, global_shape)


def abstract_arrays(tree: Any, shardings: Any) -> Any:
  """`tree`'s leaves as ShapeDtypeStructs carrying the matching `shardings` leaves: the
  target of a sharded restore or of an ahead-of-time compile."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)
