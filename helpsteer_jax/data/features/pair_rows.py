"""Preference pairs -> fixed-shape training rows for the preference losses.

Each response is rendered with the SteerLM template (the prompt's turns, then
the response as the assistant turn, optionally with an attribute label),
tokenized once over the full sequence, truncated from the left if needed
(the response is always kept whole), and its loss tokens get their segment
id (1..S) from the character spans. A pair becomes one example:

  inputs, targets, positions, segment_ids, token_segments: [2, seq_len]
  seg_scores [2, S, A] (divided by score_max), seg_mask [2, S],
  lengths [2] (response tokens), pair_weight [2] ((1, 1); zeros for padding
  rows; per row rather than a scalar so every feature has a pair axis)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from helpsteer_jax.data import segment, template
from helpsteer_jax.data.features import tokenize
from helpsteer_jax.data.features.tokenize import FeatureReport
from helpsteer_jax.data.formats.helpsteer_2d import ScoredPair, ScoredResponse
from helpsteer_jax.data.records import Conversation, Turn

ROW_KEYS = ("inputs", "targets", "positions", "segment_ids", "token_segments")


def response_pieces(prompt: str, response: str, label: str | None = None
                    ) -> tuple[list[template.Piece], int]:
  """Template pieces of prompt + response and the response's character offset."""
  conv = Conversation(system=template.DEFAULT_SYSTEM, mask_role="User",
                      turns=(*template.split_helpsteer_prompt(prompt),
                             Turn("Assistant", response, label)))
  pieces = template.sft_pieces(conv)
  target = f"{response}{template.END_OF_TURN}"
  index = max(i for i, p in enumerate(pieces) if p.loss and p.text == target)
  return pieces, sum(len(p.text) for p in pieces[:index])


def _response_row(prompt: str, resp: ScoredResponse, tokenizer, seq_len: int, truncation: str,
                  add_bos: bool, label: str | None):
  pieces, offset = response_pieces(prompt, resp.text, label)
  example = tokenize.tokenize_pieces(pieces, tokenizer, add_bos=add_bos)
  spans = segment.spans_of(resp.text, resp.segments)
  segs = segment.token_segments("".join(p.text for p in pieces), example.char_spans,
                                example.loss_mask, offset, spans)
  fitted = tokenize.truncate(example, seq_len + 1, truncation)
  if fitted is None:
    return None, False
  cut = len(example.ids) - len(fitted.ids)
  head = 1 if example.has_bos else 0
  segs = np.concatenate([segs[:head], segs[head + cut:]]) * fitted.loss_mask
  n = len(fitted.ids) - 1
  row = {k: np.zeros(seq_len, np.int32) for k in ROW_KEYS}
  row["inputs"][:n] = fitted.ids[:-1]
  row["targets"][:n] = fitted.ids[1:]
  row["positions"][:n] = np.arange(n)
  row["segment_ids"][:n] = 1
  row["token_segments"][:n] = segs[1:]
  return row, cut > 0


def pair_features(pairs: Sequence[ScoredPair], tokenizer, seq_len: int, max_segments: int,
                  score_max: float, truncation: str = "truncate_left", add_bos: bool = True,
                  label: str | None = None) -> tuple[list[dict[str, np.ndarray]], FeatureReport]:
  """Fixed-shape pair examples; every dropped pair is counted in the report."""
  report = FeatureReport(unit="pairs")
  features = []
  for pair in pairs:
    sides = (pair.chosen, pair.rejected)
    if max(len(r.segments) for r in sides) > max_segments:
      report.drop("too_many_segments")
      continue
    rows = [_response_row(pair.prompt, r, tokenizer, seq_len, truncation, add_bos, label)
            for r in sides]
    if any(row is None for row, _ in rows):
      report.drop("too_long")
      continue
    num_aspects = pair.chosen.scores.shape[1]
    example = {k: np.stack([row[k] for row, _ in rows]) for k in ROW_KEYS}
    example["seg_scores"] = np.zeros((2, max_segments, num_aspects), np.float32)
    example["seg_mask"] = np.zeros((2, max_segments), np.float32)
    for j, r in enumerate(sides):
      example["seg_scores"][j, :len(r.segments)] = r.scores / score_max
      example["seg_mask"][j, :len(r.segments)] = 1.0
    example["lengths"] = np.sum(example["token_segments"] > 0, axis=1).astype(np.float32)
    example["pair_weight"] = np.ones(2, np.float32)
    report.keep(np.sum(example["segment_ids"] > 0), example["lengths"].sum(),
                any(t for _, t in rows))
    features.append(example)
  return features, report
