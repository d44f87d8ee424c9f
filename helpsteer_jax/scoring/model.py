"""The project's attribute model as a `Scorer`: length-bucketed, batch-sharded scoring.

Conversations become NeMo's regression input (`features.regression_ids.RegressionTokenizer`,
the one tokenization training and scoring share); one that does not fit
`max_len` (after the configured truncation) gets a NaN row. Sequences are
sorted by length and scored `batch_size` at a time, each batch right-padded
to the smallest of a fixed set of length buckets (powers of two up to
`max_len`), so the compiled programs are one per bucket, all of them
compiled by `warm_up`: a server that warmed up compiles nothing while it
serves. Batches run on `frozen_pass.FrozenPass` (sharded over the mesh's batch
axes, every process feeding its own devices' rows), the parameters sharded by
the sharding rules.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from helpsteer_jax import frozen_pass
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.data.features.regression_ids import RegressionTokenizer
from helpsteer_jax.data.records import NUM_ATTRIBUTES, Conversation
from helpsteer_jax.models import builder
from helpsteer_jax.models.reward import RewardModel
from helpsteer_jax.runtime import Runtime

SMALLEST_BUCKET = 64


def length_buckets(max_len: int, smallest: int = SMALLEST_BUCKET) -> tuple[int, ...]:
  """Padded lengths: powers of two from `smallest` below `max_len`, then `max_len`."""
  out, length = [], smallest
  while length < max_len:
    out.append(length)
    length *= 2
  return tuple(out) + (int(max_len),)


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


class BucketedPass:
  """The warm-up of a pass with one program per length bucket: `buckets`, batches of
  `batch_size` rows, `params` through the `FrozenPass` `_pass`."""

  buckets: tuple[int, ...]
  batch_size: int
  params: Any
  _pass: frozen_pass.FrozenPass

  @property
  def warm_up_programs(self) -> int:
    return len(self.buckets)

  @property
  def compiled_variants(self) -> int:
    return self._pass.compiled_variants

  def warm_up(self, on_step: Callable[[], None] = lambda: None) -> None:
    """Compiles the program of every length bucket (a server then compiles nothing),
    `on_step()` after each."""
    for length in self.buckets:
      frozen_pass.FrozenPass.fetch([self._pass.dispatch(
          (self.params,), pad_batch([], self.batch_size, length))])
      on_step()


class ModelScorer(BucketedPass):
  """A `RewardModel` on the mesh: conversations (or token ids) -> [n, 9] float32."""

  def __init__(self, model: RewardModel, rt: Runtime, tok: RegressionTokenizer,
               batch_size: int):
    sharding_lib.check_batch(batch_size, rt.mesh, rt.rules, "the scoring batch")
    self.rt, self.tok, self.batch_size = rt, tok, int(batch_size)
    self.buckets = length_buckets(tok.max_len)
    self.local_rows = 0  # sequences this process has fed to its devices
    self._lock = threading.Lock()  # one batch at a time (a server scores from threads)
    graphdef, self.params = nnx.split(model, nnx.Param)
    param_shardings = builder.state_shardings(self.params, rt.mesh, rt.rules)
    self._host_rows = sharding_lib.host_local_batch_slice(batch_size)
    rules = rt.rules

    def score(params, batch):
      with sharding_lib.axis_rules(rules):
        return nnx.merge(graphdef, params).score_last(
            batch["tokens"], batch["positions"], batch["segment_ids"])

    self._pass = frozen_pass.FrozenPass(score, rt.mesh,
                             NamedSharding(rt.mesh, sharding_lib.batch_spec(rules)),
                             self.batch_size, (param_shardings,))

  def __call__(self, convs: Sequence[Conversation]) -> np.ndarray:
    ids = [self.tok.ids(c) for c in convs]
    out = np.full((len(convs), NUM_ATTRIBUTES), np.nan, np.float32)
    kept = [i for i, x in enumerate(ids) if x is not None]
    out[kept] = self.score_ids([ids[i] for i in kept])
    return out

  def bucket(self, length: int) -> int:
    """The padded length of a batch whose longest sequence has `length` tokens."""
    for b in self.buckets:
      if length <= b:
        return b
    raise ValueError(f"a sequence of {length} tokens is longer than max_len {self.buckets[-1]}")

  def _run(self, batch: dict[str, np.ndarray]) -> sharding_lib.Pending:
    return self._pass.dispatch((self.params,), batch)

  def score_ids(self, seqs: Sequence[np.ndarray],
                on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """[len(seqs), 9] float32 for token sequences, in input order; `on_batch(k)` after
    each batch."""
    out = np.zeros((len(seqs), NUM_ATTRIBUTES), np.float32)
    with self._lock:
      pending = None  # fetched one batch late, so the host prepares the next meanwhile
      for idx in length_batches([len(s) for s in seqs], self.batch_size) + [None]:
        if idx is not None:
          length = self.bucket(max(len(seqs[i]) for i in idx))
          preds = self._run(pad_batch([seqs[i] for i in idx], len(idx), length))
          self.local_rows += len(range(len(idx))[self._host_rows])
        if pending is not None:
          done_idx, done = pending
          out[done_idx] = frozen_pass.FrozenPass.fetch([done])
          if on_batch is not None:
            on_batch(len(done_idx))
        pending = None if idx is None else (idx, preds)
    return out
