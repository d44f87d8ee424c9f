"""Tokenized examples -> packed or padded batches, with grain.

Each example is a dict of per-token features (a task's batch schema in
`data.batches`, e.g. next-token `inputs`, `targets`, `weights` for SFT),
shuffled per epoch from a seed, packed first-fit into rows of
`seq_len` with segment ids and per-segment positions (or padded, one example
per row; or taken as they are when already fixed-shape rows), and batched
into GLOBAL batches. Every process computes the same global batch (packing is
cheap next to a train step, and HelpSteer-sized data fits every host) and
hands only the rows its devices hold to the accelerators (see
`train.loop.Trainer`), so the batches, and therefore the losses, do not depend
on the number of processes, and a run can resume on a different number of
hosts. The training iterator is a grain `DatasetIterator`: its state is the
data position saved in checkpoints.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Sequence

import grain
import numpy as np


def _pad_row(features: dict[str, np.ndarray], seq_len: int) -> dict[str, np.ndarray]:
  """One example per row, right-padded. An example may bring its own
  `segment_ids` / `positions` (several sequences in one row, e.g. a
  preference pair); otherwise it is segment 1 at positions 0..n-1."""
  n = len(features["inputs"])
  out = {k: np.zeros((seq_len,) + v.shape[1:], v.dtype) for k, v in features.items()}
  for k, v in features.items():
    out[k][:n] = v
  if "segment_ids" not in features:
    out["segment_ids"] = np.zeros(seq_len, np.int32)
    out["segment_ids"][:n] = 1
  if "positions" not in features:
    out["positions"] = np.zeros(seq_len, np.int32)
    out["positions"][:n] = np.arange(n)
  return out


def _rename_packed(batch: dict[str, np.ndarray], keys: Sequence[str]) -> dict[str, np.ndarray]:
  out = {k: batch[k] for k in keys}
  out["segment_ids"] = batch["inputs_segment_ids"].astype(np.int32)
  out["positions"] = batch["inputs_positions"].astype(np.int32)
  return out


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  seq_len: int
  rows: int           # rows of each global batch
  packing: bool = True
  seed: int = 0
  fixed_shape: bool = False  # examples are already fixed-shape rows: batch them as they are


def _rows(ds: grain.IterDataset, cfg: PipelineConfig, drop_remainder: bool,
          keys: Sequence[str]) -> grain.IterDataset:
  if cfg.fixed_shape:
    return ds.batch(cfg.rows, drop_remainder=drop_remainder)
  if cfg.packing:
    if "segment_ids" in keys or "positions" in keys:
      raise ValueError("examples that carry their own segment_ids cannot be packed;"
                       " set data.packing=False")
    lengths = {k: cfg.seq_len for k in keys}
    ds = grain.experimental.FirstFitPackIterDataset(
        ds, length_struct=lengths, num_packing_bins=max(cfg.rows, 1), shuffle_bins=False)
    return ds.batch(cfg.rows, drop_remainder=drop_remainder).map(
        lambda b: _rename_packed(b, keys))
  ds = ds.map(lambda f: _pad_row(f, cfg.seq_len))
  return ds.batch(cfg.rows, drop_remainder=drop_remainder)


def training_dataset(features: Sequence[dict[str, np.ndarray]],
                     cfg: PipelineConfig) -> grain.IterDataset:
  """Endless, reshuffled every epoch, in global batches of `rows`."""
  if not features:
    raise ValueError("the training set is empty after reading and filtering")
  ds = grain.MapDataset.source(list(features)).seed(cfg.seed).shuffle().repeat(None)
  return _rows(ds.to_iter_dataset(), cfg, drop_remainder=True, keys=tuple(features[0]))


def evaluation_batches(features: Sequence[dict[str, np.ndarray]],
                       cfg: PipelineConfig) -> Iterator[dict[str, np.ndarray]]:
  """One pass in order; the last batch is padded with empty rows (weight 0)."""
  if not len(features):
    return
  ds = grain.MapDataset.source(list(features)).to_iter_dataset()
  for batch in _rows(ds, cfg, drop_remainder=False, keys=tuple(features[0])):
    n = len(batch["inputs"])
    if n < cfg.rows:
      batch = {k: np.concatenate([v, np.zeros((cfg.rows - n,) + v.shape[1:], v.dtype)])
               for k, v in batch.items()}
    yield batch


def estimate_rows_per_epoch(lengths: Sequence[int], seq_len: int, packing: bool) -> int:
  """Rows one epoch fills (first-fit over the given order, as grain packs)."""
  if not packing:
    return len(lengths)
  free: list[int] = []
  for n in lengths:
    for i, room in enumerate(free):
      if room >= n:
        free[i] -= n
        break
    else:
      free.append(seq_len - n)
  return len(free)


def packing_efficiency(features: Sequence[dict], seq_len: int, packing: bool,
                       sample: int = 5000) -> float:
  """Fraction of row slots holding real tokens (estimated on the first `sample` examples)."""
  lengths = [len(f["inputs"]) for f in features[:sample]]
  if not lengths:
    return 0.0
  return sum(lengths) / (estimate_rows_per_epoch(lengths, seq_len, packing) * seq_len)
