"""A fingerprint of the frozen base weights under LoRA adapters, kept with the checkpoints.

A LoRA checkpoint holds only the adapters and their optimizer state; they
mean something only on the base they were trained on. The fingerprint is
each base tensor's path, shape, dtype and two sums (of the values and of
their squares, in fp32 on the mesh): cheap for a 70B model, the same on any
mesh up to reduction order, and different for any other base. The first
run records it in `checkpoints/base_fingerprint.json`; a resume compares.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from helpsteer_jax import processes
from helpsteer_jax.errors import ConfigError

FILE = "base_fingerprint.json"
RTOL = 1e-4  # reductions on another mesh sum in another order


def fingerprint(base: dict) -> dict[str, list]:
  """{path: [shape, dtype, sum, sum of squares]} of every base tensor."""
  leaves = jax.tree_util.tree_leaves_with_path(base)
  if not leaves:
    return {}
  sums = jax.jit(lambda xs: [jnp.stack([jnp.sum(x.astype(jnp.float32)),
                                        jnp.sum(jnp.square(x.astype(jnp.float32)))])
                             for x in xs])([x for _, x in leaves])
  out = {}
  for (path, x), s in zip(leaves, jax.device_get(sums)):
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    out[name] = [list(x.shape), str(x.dtype), float(s[0]), float(s[1])]
  return out


def _differences(saved: dict, current: dict) -> list[str]:
  out = []
  for name in sorted(set(saved) | set(current)):
    a, b = saved.get(name), current.get(name)
    if a is None or b is None:
      out.append(f"{name}: {'missing now' if b is None else 'new'}")
    elif a[:2] != b[:2]:
      out.append(f"{name}: shape/dtype {a[:2]} then, {b[:2]} now")
    elif not np.allclose(a[2:], b[2:], rtol=RTOL, atol=1e-6):
      out.append(f"{name}: sums {a[2:]} then, {b[2:]} now")
  return out


def check_or_record(directory: str | pathlib.Path, base: dict, resuming: bool) -> None:
  """Records the fingerprint (process 0) or, on resume, refuses another base."""
  if not base:
    return
  path = pathlib.Path(directory) / FILE
  current = fingerprint(base)
  if resuming and path.is_file():
    diffs = _differences(json.loads(path.read_text()), current)
    if diffs:
      raise ConfigError(
          f"the checkpoints in {directory} hold LoRA adapters trained on other base weights"
          f" ({len(diffs)} tensors differ, e.g. {'; '.join(diffs[:3])}): resume with the"
          " same init.source / base_dtype, or start in a new workdir")
    return
  if processes.is_primary():
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=1) + "\n")
