"""Preference pairs -> fixed-shape training rows for the preference losses.

Each response is rendered with the SteerLM template (the prompt's turns, then
the response as the assistant turn, optionally with an attribute label),
tokenized once over the full sequence, truncated from the left if needed
(the response is always kept whole), and its loss tokens get their segment
id (1..S) from the character spans. A pair becomes one `batches.PAIR_BATCH`
example ([2, seq_len] token rows, [2, S, A] segment scores divided by
score_max; `pair_weight` is per row rather than a scalar so that every field
has the pair axis).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from helpsteer_jax.data import segment, template
from helpsteer_jax.data.batches import PAIR_BATCH
from helpsteer_jax.data.features import tokenize
from helpsteer_jax.data.features.tokenize import FeatureReport
from helpsteer_jax.data.formats.helpsteer_2d import ScoredPair, ScoredResponse
from helpsteer_jax.data.records import Conversation, Turn


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


def _fill_row(example: dict[str, np.ndarray], side: int, prompt: str, resp: ScoredResponse,
              tokenizer, seq_len: int, truncation: str, add_bos: bool,
              label: str | None) -> bool | None:
  """Writes one response's row into `example[...][side]`; truncated?, or None if it cannot fit."""
  pieces, offset = response_pieces(prompt, resp.text, label)
  tokens = tokenize.tokenize_pieces(pieces, tokenizer, add_bos=add_bos)
  spans = segment.spans_of(resp.text, resp.segments)
  segs = segment.token_segments("".join(p.text for p in pieces), tokens.char_spans,
                                tokens.loss_mask, offset, spans)
  fitted = tokenize.truncate(tokens, seq_len + 1, truncation)
  if fitted is None:
    return None
  cut = len(tokens.ids) - len(fitted.ids)
  head = 1 if tokens.has_bos else 0
  segs = np.concatenate([segs[:head], segs[head + cut:]]) * fitted.loss_mask
  n = len(fitted.ids) - 1
  example["inputs"][side, :n] = fitted.ids[:-1]
  example["targets"][side, :n] = fitted.ids[1:]
  example["positions"][side, :n] = np.arange(n)
  example["segment_ids"][side, :n] = 1
  example["token_segments"][side, :n] = segs[1:]
  example["seg_scores"][side, :len(resp.segments)] = resp.scores
  example["seg_mask"][side, :len(resp.segments)] = 1.0
  return cut > 0


def pair_features(pairs: Sequence[ScoredPair], tokenizer, seq_len: int, max_segments: int,
                  score_max: float, truncation: str = "truncate_left", add_bos: bool = True,
                  label: str | None = None) -> tuple[list[dict[str, np.ndarray]], FeatureReport]:
  """PAIR_BATCH examples; every dropped pair is counted in the report."""
  report = FeatureReport(unit="pairs")
  features = []
  for pair in pairs:
    sides = (pair.chosen, pair.rejected)
    if max(len(r.segments) for r in sides) > max_segments:
      report.drop("too_many_segments")
      continue
    example = PAIR_BATCH.zeros_example(length=seq_len, segments=max_segments,
                                       aspects=pair.chosen.scores.shape[1])
    truncated = [_fill_row(example, j, pair.prompt, r, tokenizer, seq_len, truncation, add_bos,
                           label) for j, r in enumerate(sides)]
    if None in truncated:
      report.drop("too_long")
      continue
    example["seg_scores"] /= score_max
    example["lengths"][:] = np.sum(example["token_segments"] > 0, axis=1)
    example["pair_weight"][:] = 1.0
    report.keep(np.sum(example["segment_ids"] > 0), example["lengths"].sum(), any(truncated))
    features.append(example)
  return features, report
