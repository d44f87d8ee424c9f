"""SteerLM 2.0 groups -> fixed-shape examples [n, T] of `STEERLM2_BATCH`.

Each response is templated as AC-SFT trains it (`template.sft_pieces`: loss on
the response, its END_OF_TURN and the next turn marker, as NeMo-Aligner's
SteerLM 2.0 dataset masks them), tokenized in one call and fitted into T + 1
tokens; a group any of whose responses does not fit is dropped whole. The
importance weights are computed here, on the host in float64, from the
file's three log-probabilities (`importance_weights`), as NeMo-Aligner's dataset
does before training.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from helpsteer_jax.data import template
from helpsteer_jax.data.batches import STEERLM2_BATCH
from helpsteer_jax.data.features import tokenize
from helpsteer_jax.data.formats.steerlm2 import Group


def importance_weights(log_p_attributes: Sequence[float], log_p_unconditional: Sequence[float],
                       log_q_start: Sequence[float]) -> np.ndarray:
  """w [..., n]: the softmax over a group's responses of log P(a|x,y) + log P(y|x) -
  log Q'(y|a,x), in float64."""
  logw = (np.asarray(log_p_attributes, np.float64) + np.asarray(log_p_unconditional, np.float64)
          - np.asarray(log_q_start, np.float64))
  logw -= logw.max(-1, keepdims=True)
  w = np.exp(logw)
  return w / w.sum(-1, keepdims=True)


def _row(ids: np.ndarray, loss: np.ndarray, length: int) -> dict[str, np.ndarray]:
  n = len(ids) - 1
  out = {k: np.zeros(length, np.int32) for k in ("inputs", "targets", "positions",
                                                 "segment_ids")}
  out["inputs"][:n], out["targets"][:n] = ids[:-1], ids[1:]
  out["positions"][:n], out["segment_ids"][:n] = np.arange(n), 1
  out["weights"] = np.zeros(length, np.float32)
  out["weights"][:n] = loss[1:]
  return out


def group_example(group: Group, tokenizer, seq_len: int, truncation: str = "truncate_left",
                  add_bos: bool = True, labelled: bool = True,
                  ws: np.ndarray | None = None) -> dict[str, np.ndarray] | None:
  """A `STEERLM2_BATCH` example of `group` (None if a response does not fit `seq_len`).

  `labelled=False` leaves the label out of the prompt (the unconditional model's input);
  `ws` defaults to the group's importance weights.
  """
  rows = []
  for r in group.responses:
    pieces = template.sft_pieces(group.conversation(r.text, labelled))
    fitted = tokenize.truncate(tokenize.tokenize_pieces(pieces, tokenizer, add_bos=add_bos,
                                                        source=group.source),
                               seq_len + 1, truncation)
    if fitted is None or not fitted.loss_mask[1:].any():
      return None
    rows.append(_row(fitted.ids, fitted.loss_mask, seq_len))
  if ws is None:
    ws = importance_weights([r.log_p_attributes for r in group.responses],
                            [r.log_p_unconditional for r in group.responses],
                            [r.log_q for r in group.responses])
  stacked = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
  return STEERLM2_BATCH.example(
      **stacked, log_q=np.asarray([r.log_q for r in group.responses], np.float32),
      ws=np.asarray(ws, np.float32), group_weight=np.ones(len(rows), np.float32))


def group_examples(groups: Sequence[Group], tokenizer, seq_len: int,
                   truncation: str = "truncate_left", add_bos: bool = True,
                   labelled: bool = True) -> tuple[list[dict], list[int], tokenize.FeatureReport]:
  """(examples, the index of each example's group, what was kept and dropped)."""
  report = tokenize.FeatureReport()
  examples, kept = [], []
  for i, g in enumerate(groups):
    example = group_example(g, tokenizer, seq_len, truncation, add_bos, labelled)
    if example is None:
      report.drop("too_long")
      continue
    report.keep(int(example["segment_ids"].sum()), int(example["weights"].sum()), False)
    examples.append(example)
    kept.append(i)
  return examples, kept, report
