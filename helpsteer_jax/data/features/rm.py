"""Conversations and preference pairs -> reward-model training features.

Regression: the `template.regression_pieces` text of each conversation,
tokenized, with per-token `labels` [n, 9] (the attribute scores at the last
token, -100 elsewhere and for missing attributes) and `readout` (1.0 at the
last token). Per-token features let the grain pipeline pack several
sequences into a row: the head is read where `readout` is set.

Preference pairs: chosen and rejected in one row as two segments (their own
`segment_ids` and `positions`, so they do not attend to each other), with
`pair` = 1 / 2 at each one's last token and `margin` = the strength there.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from helpsteer_jax.data.batches import BT_BATCH, REGRESSION_BATCH
from helpsteer_jax.data.features.regression_ids import label_vector, regression_ids
from helpsteer_jax.data.features.tokenize import FeatureReport
from helpsteer_jax.data.formats.preference import PreferencePair
from helpsteer_jax.data.records import ATTRIBUTES, CHOSEN, IGNORE_LABEL, REJECTED, Conversation


def regression_features(conversations: Sequence[Conversation], tokenizer, seq_len: int,
                        truncation: str = "truncate_left", add_bos: bool = True
                        ) -> tuple[list[dict[str, np.ndarray]], FeatureReport]:
  """Labelled conversations -> regression examples; every drop is counted.

  `loss_tokens` counts labels.
  """
  report = FeatureReport()
  features = []
  for conv in conversations:
    labels = label_vector(conv.attributes)
    if not (labels != IGNORE_LABEL).any():
      report.drop("no_labels")
      continue
    ids, truncated = regression_ids(conv, tokenizer, seq_len, truncation, add_bos)
    if ids is None:
      report.drop("too_long")
      continue
    report.keep(len(ids), (labels != IGNORE_LABEL).sum(), truncated)
    per_token = np.full((len(ids), len(ATTRIBUTES)), IGNORE_LABEL, np.float32)
    per_token[-1] = labels
    readout = np.zeros(len(ids), np.float32)
    readout[-1] = 1.0
    features.append(REGRESSION_BATCH.example(inputs=ids, labels=per_token, readout=readout))
  return features, report


def bt_features(pairs: Sequence[PreferencePair], tokenizer, seq_len: int,
                truncation: str = "truncate_left", add_bos: bool = True
                ) -> tuple[list[dict[str, np.ndarray]], FeatureReport]:
  """Pairs -> one Bradley-Terry row each (chosen then rejected); ties are skipped.

  Each response gets at most seq_len // 2 tokens (left-truncated as in
  regression, or dropped with truncation="drop").
  """
  report = FeatureReport(unit="pairs")
  features = []
  for pair in pairs:
    if pair.strength == 0:
      report.drop("tie")
      continue
    parts = [regression_ids(c, tokenizer, seq_len // 2, truncation, add_bos)
             for c in (pair.chosen, pair.rejected)]
    if any(ids is None for ids, _ in parts):
      report.drop("too_long")
      continue
    (chosen, _), (rejected, _) = parts
    n_c, n_r = len(chosen), len(rejected)
    report.keep(n_c + n_r, 1, any(t for _, t in parts))
    marks = np.zeros(n_c + n_r, np.int32)
    marks[n_c - 1], marks[-1] = CHOSEN, REJECTED
    margin = np.zeros(n_c + n_r, np.float32)
    margin[n_c - 1] = pair.strength
    features.append(BT_BATCH.example(
        inputs=np.concatenate([chosen, rejected]), segment_ids=np.repeat([1, 2], [n_c, n_r]),
        positions=np.concatenate([np.arange(n_c), np.arange(n_r)]), pair=marks, margin=margin))
  return features, report
