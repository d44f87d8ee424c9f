"""Batched, length-bucketed scoring with the reward model over the mesh.

Sequences are sorted by length and scored `batch_size` at a time, each batch
right-padded to a multiple of `pad_multiple` tokens (a few compiled shapes,
little padding); the batch is sharded over the mesh's batch axes and the
parameters by the sharding rules. Results come back in input order.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.models import builder
from helpsteer_jax.models.reward import NUM_ATTRIBUTES, RewardModel
from helpsteer_jax.runtime import Runtime


def length_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
  """Indices grouped into batches of similar length (longest first)."""
  order = np.argsort(-np.asarray(lengths, np.int64), kind="stable")
  return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def pad_batch(seqs: Sequence[np.ndarray], rows: int, length: int) -> dict[str, np.ndarray]:
  """Right-padded tokens / positions / segment ids; missing rows are empty."""
  tokens = np.zeros((rows, length), np.int32)
  segment_ids = np.zeros((rows, length), np.int32)
  positions = np.zeros((rows, length), np.int32)
  for i, ids in enumerate(seqs):
    n = len(ids)
    tokens[i, :n], segment_ids[i, :n], positions[i, :n] = ids, 1, np.arange(n)
  return {"tokens": tokens, "positions": positions, "segment_ids": segment_ids}


class RewardModelScorer:
  """Scores token sequences with a `RewardModel`: [N, 9] predictions."""

  def __init__(self, model: RewardModel, rt: Runtime, batch_size: int, pad_multiple: int = 64):
    sharding_lib.check_batch(batch_size, rt.mesh, rt.rules, "the scoring batch")
    self.rt, self.batch_size, self.pad_multiple = rt, batch_size, max(int(pad_multiple), 1)
    graphdef, params = nnx.split(model, nnx.Param)
    self.params = params
    param_shardings = builder.state_shardings(params, rt.mesh, rt.rules)
    batch_sharding = NamedSharding(rt.mesh, sharding_lib.batch_spec(rt.rules))
    self._host_rows = sharding_lib.host_local_batch_slice(batch_size)
    self.local_rows = 0  # sequences this process has fed to its devices
    rules = rt.rules

    def score(params, batch):
      with sharding_lib.axis_rules(rules):
        return nnx.merge(graphdef, params).score_last(
            batch["tokens"], batch["positions"], batch["segment_ids"])

    with jax.set_mesh(rt.mesh):
      self._score = jax.jit(score, in_shardings=(param_shardings, batch_sharding),
                            out_shardings=NamedSharding(rt.mesh, PartitionSpec()))

  def _padded_length(self, n: int) -> int:
    return -(-n // self.pad_multiple) * self.pad_multiple

  def score(self, seqs: Sequence[np.ndarray],
            on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """[len(seqs), 9] fp32, in input order; `on_batch(n)` after each batch."""
    if not len(seqs):
      return np.zeros((0, NUM_ATTRIBUTES), np.float32)
    results: list[tuple[np.ndarray, np.ndarray]] = []
    pending = None  # fetched one batch late, so the host prepares the next meanwhile
    spec = sharding_lib.batch_spec(self.rt.rules)
    for idx in length_batches([len(s) for s in seqs], self.batch_size) + [None]:
      if idx is not None:
        length = self._padded_length(max(len(seqs[i]) for i in idx))
        batch = pad_batch([seqs[i] for i in idx], self.batch_size, length)
        local = {k: v[self._host_rows] for k, v in batch.items()}
        self.local_rows += len(range(len(idx))[self._host_rows])
        with jax.set_mesh(self.rt.mesh):
          arrays = {k: sharding_lib.to_global_array(v, self.rt.mesh, spec)
                    for k, v in local.items()}
          preds = self._score(self.params, arrays)
      if pending is not None:
        done_idx, done = pending
        results.append((done_idx, np.asarray(jax.device_get(done))[:len(done_idx)]))
        if on_batch is not None:
          on_batch(len(done_idx))
      pending = None if idx is None else (idx, preds)
    out = np.zeros((len(seqs), NUM_ATTRIBUTES), np.float32)
    for idx, preds in results:
      out[idx] = preds
    return out
