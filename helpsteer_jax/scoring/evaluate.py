"""Scoring evaluation sets with an attribute scorer.

Shared by the evaluate_rm task and the end of attribute_model training:
attribute metrics on labelled conversations, pairwise accuracy on
preference pairs (HelpSteer2-Preference, RewardBench). A conversation the
scorer could not score (NaN: too long) is dropped and counted.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from helpsteer_jax.data.features.regression_ids import label_vector
from helpsteer_jax.data.formats.preference import PreferencePair
from helpsteer_jax.data.records import ATTRIBUTES, Conversation
from helpsteer_jax.scoring import metrics as rm_metrics
from helpsteer_jax.scoring import rewards
from helpsteer_jax.scoring.scorer import Scorer, predict


def score_conversations(scorer: Scorer, convs: Sequence[Conversation],
                        on_batch: Callable[[int], None] | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
  """(predictions of the scored conversations, their indices); unscored ones dropped."""
  preds = predict(convs, scorer, on_batch)
  kept = np.flatnonzero(~np.isnan(preds).any(axis=1))
  return preds[kept], kept


def evaluate_attributes(scorer: Scorer, convs: Sequence[Conversation], on_batch=None) -> dict:
  """{metrics, predictions, labels, dropped} on labelled conversations."""
  preds, kept = score_conversations(scorer, convs, on_batch)
  labels = np.zeros((len(kept), len(ATTRIBUTES)), np.float32)
  for row, i in enumerate(kept):
    labels[row] = label_vector(convs[i].attributes)
  return {"metrics": rm_metrics.attribute_metrics(preds, labels), "predictions": preds,
          "labels": labels, "dropped": len(convs) - len(kept)}


def evaluate_pairs(scorer: Scorer, pairs: Sequence[PreferencePair], weights,
                   on_batch=None) -> dict:
  """Pairwise accuracy (overall and per subset) with reward = predictions . weights.

  Ties (strength 0) are not counted; pairs with a response not scored are dropped;
  `ties`: the counted pairs whose rewards are equal (wrong, as RewardBench counts them).
  """
  pairs = [p for p in pairs if p.strength != 0]
  convs = [c for p in pairs for c in (p.chosen, p.rejected)]
  reward = rewards.rewards(predict(convs, scorer, on_batch), weights)
  r_c, r_r = reward[0::2], reward[1::2]
  ok = ~(np.isnan(r_c) | np.isnan(r_r))
  subsets = [p.subset for p, k in zip(pairs, ok) if k]
  by_subset = rm_metrics.accuracy_by_subset(r_c[ok], r_r[ok], subsets)
  return {"accuracy": rm_metrics.pairwise_accuracy(r_c[ok], r_r[ok]), "count": int(ok.sum()),
          "dropped": int((~ok).sum()), "ties": int(np.sum(r_c[ok] == r_r[ok])),
          "by_subset": by_subset,
          "sections": rm_metrics.rewardbench_sections(by_subset),
          "section_counts": rm_metrics.rewardbench_section_counts(by_subset)}
