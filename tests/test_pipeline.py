"""The grain input pipeline: what a grain upgrade could change while our code stays the
same (the epoch shuffle, first-fit packing, the iterator state saved in checkpoints)."""

import numpy as np
import pytest

from helpsteer_jax.data import pipeline

from train_utils import synthetic_features

pytestmark = pytest.mark.version_tier

SEQ, ROWS = 128, 4


def _tokens(batch):
  """The (segment, tokens) pieces of a packed batch, row by row."""
  out = []
  for inputs, seg in zip(batch["inputs"], batch["segment_ids"]):
    for s in sorted(set(seg.tolist()) - {0}):
      out.append(tuple(inputs[seg == s].tolist()))
  return out


def test_packed_rows_hold_whole_examples_with_their_own_positions():
  feats = synthetic_features(24)
  batch = next(iter(pipeline.training_dataset(feats, pipeline.PipelineConfig(SEQ, ROWS))))
  assert batch["inputs"].shape == (ROWS, SEQ)
  examples = {tuple(f["inputs"].tolist()) for f in feats}
  pieces = _tokens(batch)
  assert pieces and all(p in examples for p in pieces)
  for pos, seg in zip(batch["positions"], batch["segment_ids"]):
    for s in set(seg.tolist()) - {0}:  # positions restart at 0 in every segment
      np.testing.assert_array_equal(pos[seg == s], np.arange(int((seg == s).sum())))
  assert batch["segment_ids"].dtype == np.int32 and batch["positions"].dtype == np.int32


def test_each_epoch_is_a_seeded_permutation():
  feats = synthetic_features(16)
  cfg = pipeline.PipelineConfig(64, 1, packing=False, seed=3)
  order = [tuple(b["inputs"][0][b["segment_ids"][0] > 0].tolist())
           for _, b in zip(range(32), pipeline.training_dataset(feats, cfg))]
  examples = sorted(tuple(f["inputs"].tolist()) for f in feats)
  first, second = order[:16], order[16:]
  assert sorted(first) == examples and sorted(second) == examples
  assert first != second  # reshuffled each epoch
  again = [tuple(b["inputs"][0][b["segment_ids"][0] > 0].tolist())
           for _, b in zip(range(16), pipeline.training_dataset(feats, cfg))]
  assert again == first  # the same seed, the same order


def test_the_iterator_state_resumes_the_stream():
  feats = synthetic_features(40)
  cfg = pipeline.PipelineConfig(SEQ, ROWS, seed=1)
  it = iter(pipeline.training_dataset(feats, cfg))
  for _ in range(3):
    next(it)
  state = it.get_state()
  want = [next(it) for _ in range(4)]
  resumed = iter(pipeline.training_dataset(feats, cfg))
  resumed.set_state(state)
  for a, b in zip(want, [next(resumed) for _ in range(4)]):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_evaluation_batches_cover_every_example_once_in_order():
  feats = synthetic_features(9)
  cfg = pipeline.PipelineConfig(64, 4, packing=False)
  batches = list(pipeline.evaluation_batches(feats, cfg))
  assert len(batches) == 3 and all(b["inputs"].shape == (4, 64) for b in batches)
  seen = [tuple(b["inputs"][r][b["segment_ids"][r] > 0].tolist())
          for b in batches for r in range(4) if b["segment_ids"][r].any()]
  assert seen == [tuple(f["inputs"].tolist()) for f in feats]
  assert not batches[-1]["segment_ids"][1:].any()  # the last batch padded with empty rows
