"""Conversations -> next-token features for AC-SFT."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from helpsteer_jax.data import template
from helpsteer_jax.data.batches import SFT_BATCH
from helpsteer_jax.data.features import tokenize
from helpsteer_jax.data.records import Conversation


def next_token_features(ids: np.ndarray, loss_mask: np.ndarray) -> dict[str, np.ndarray]:
  """An SFT_BATCH example: inputs = ids[:-1], targets = ids[1:], weights = the
  targets' loss flags."""
  ids = np.asarray(ids)
  return SFT_BATCH.example(inputs=ids[:-1], targets=ids[1:], weights=loss_mask[1:])


def sft_features(conversations: Sequence[Conversation], tokenizer, seq_len: int,
                 truncation: str = "truncate_left", add_bos: bool = True
                 ) -> tuple[list[dict[str, np.ndarray]], tokenize.FeatureReport]:
  """Templates, tokenizes and truncates; every dropped example is counted."""
  report = tokenize.FeatureReport()
  features = []
  for conv in conversations:
    example = tokenize.tokenize_pieces(template.sft_pieces(conv), tokenizer, add_bos=add_bos)
    fitted = tokenize.truncate(example, seq_len + 1, truncation)
    if fitted is None:
      report.drop("too_long")
      continue
    if not fitted.loss_mask[1:].any():
      report.drop("no_loss")
      continue
    report.keep(len(fitted.ids) - 1, fitted.loss_mask[1:].sum(),
                truncated=len(fitted.ids) < len(example.ids))
    features.append(next_token_features(fitted.ids, fitted.loss_mask))
  return features, report
