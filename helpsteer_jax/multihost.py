"""Splitting host-side work across processes, and decisions every process shares.

Tasks whose work the mesh does not split (a host-side Python scorer, say)
give process p a contiguous share of the items and gather the results in
process order, so every process ends with the same array as a one-process
run. Decisions read from files another process may be writing (how many
output rows exist, which cached parts are missing) are made on process 0
and broadcast, so every process runs the same loop.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import jax
import numpy as np
from absl import logging

from helpsteer_jax import distributed, processes
from helpsteer_jax.errors import ConfigError

T = TypeVar("T")


def on_primary(decide: Callable[[], T]) -> T:
  """`decide()` run on process 0 only; its JSON result (or ConfigError) on every process."""
  if jax.process_count() == 1:
    return decide()
  outcome = None
  if processes.is_primary():
    try:
      outcome = {"value": decide()}
    except ConfigError as e:
      outcome = {"error": str(e)}
  outcome = distributed.broadcast_from_primary(outcome)
  if "error" in outcome:
    # Process 0 hosts the coordination service: none leaves before all have the error.
    distributed.barrier("on_primary_error")
    raise ConfigError(outcome["error"])
  return outcome["value"]


def process_share(n: int) -> slice:
  """This process's contiguous share of `n` items (the last shares may be shorter)."""
  per = -(-n // jax.process_count())
  start = min(n, jax.process_index() * per)
  return slice(start, min(n, start + per))


def _gather_rows(local: np.ndarray, n: int) -> np.ndarray:
  """Every process's `process_share(n)` rows, concatenated in process order.

  The rows travel as raw bytes, so any dtype (float64 too) arrives unchanged.
  """
  if jax.process_count() == 1 or n == 0:
    return local
  from jax.experimental import multihost_utils
  per = -(-n // jax.process_count())
  padded = np.zeros((per,) + local.shape[1:], local.dtype)
  padded[:len(local)] = local
  raw = np.ascontiguousarray(padded).reshape(per, -1).view(np.uint8)
  stacked = np.asarray(multihost_utils.process_allgather(raw, tiled=False))
  return stacked.view(local.dtype).reshape((-1,) + local.shape[1:])[:n]


def split_map(fn: Callable[[Sequence], np.ndarray], items: Sequence, width: int,
              dtype=np.float32) -> np.ndarray:
  """`fn` ([k] items -> [k, width]) applied by each process to its share, gathered.

  Host-side work that the mesh does not split: every process gets the
  [len(items), width] result, having computed only its contiguous share.
  """
  mine = items[process_share(len(items))]
  local = np.asarray(fn(mine), dtype) if len(mine) else np.zeros((0, width), dtype)
  return _gather_rows(local, len(items))


def report_split(what: str, local: int) -> list[int]:
  """Gathers each process's count of `what` and logs it on process 0 (a collective)."""
  counts = [int(local)]
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    counts = np.asarray(multihost_utils.process_allgather(np.int32(local))).reshape(-1).tolist()
  logging.info("%s per process: %s", what, counts)
  return counts
