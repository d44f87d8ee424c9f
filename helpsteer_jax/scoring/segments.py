"""Per-segment scores from an attribute scorer (HelpSteer-2D without GPT-4).

Both responses of a pair are cut into sentence segments, and every segment
is scored on the five HelpSteer attributes by an attribute scorer
(`scorer.Scorer`). Two
ways to turn whole-response scores into per-segment scores (`mode`):

- "in_context" (default): segment k's score is the model's score of the
  response prefix that ends with segment k, i.e. the segment judged together
  with the context it follows.
- "prefix_difference": the change segment k makes, f(prefix_k) -
  f(prefix_{k-1}), shifted to the middle of the scale (score_max / 2 + d) and
  clipped to [0, score_max].

Scores are clipped to [0, score_max]. The README explains the default.

Several processes: every process reads and segments all pairs and calls the
scorer with the same conversations (the scorer shares the work out), so every
process ends with all scores; process 0 writes them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from helpsteer_jax import multihost
from helpsteer_jax.data import segment
from helpsteer_jax.data.formats.helpsteer import helpsteer_conversation
from helpsteer_jax.data.formats.helpsteer_2d import PlainPair, ScoredPair, ScoredResponse
from helpsteer_jax.data.records import ATTRIBUTES, HELPSTEER_ATTRIBUTES, Conversation
from helpsteer_jax.data.template import regression_text
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.progress import Progress
from helpsteer_jax.scoring.scorer import Scorer
from helpsteer_jax.scoring.scorer import predict as predict_chunks

MODES = ("in_context", "prefix_difference")
_HELPSTEER = [ATTRIBUTES.index(a) for a in HELPSTEER_ATTRIBUTES]


def prefix_conversations(prompt: str, response: str,
                         spans: Sequence[tuple[int, int]]) -> list[Conversation]:
  """The empty response and each prefix ending a segment, as conversations to score."""
  prefixes = [""] + [response[:end].rstrip() for _, end in spans]
  return [helpsteer_conversation(prompt, p, {}) for p in prefixes]


def prefix_texts(prompt: str, response: str, spans: Sequence[tuple[int, int]]) -> list[str]:
  """Regression texts of the empty response and of each prefix ending a segment."""
  return [regression_text(c) for c in prefix_conversations(prompt, response, spans)]


def predict(convs: Sequence[Conversation], scorer: Scorer, chunk: int = 512) -> np.ndarray:
  """[n, 9] predictions for the last response of every conversation, on every process, in
  scorer calls of `chunk` conversations, with a progress bar."""
  progress = Progress(total=len(convs), initial=0, desc="build_2d", unit="text")
  try:
    preds = predict_chunks(convs, scorer, progress.update, chunk)
  finally:
    progress.close()
  multihost.report_split("build_2d: texts scored", scorer.local_rows)
  return preds


def _segment_scores(prefix_scores: np.ndarray, mode: str, score_max: float) -> np.ndarray:
  """[S+1, 5] prefix scores (the first for the empty response) -> [S, 5]."""
  if mode == "in_context":
    out = prefix_scores[1:]
  else:
    out = score_max / 2 + np.diff(prefix_scores, axis=0)
  return np.clip(out, 0.0, score_max).astype(np.float32)


def score_pairs(pairs: Sequence[PlainPair], scorer: Scorer, mode: str = "in_context",
                score_max: float = 4.0, chunk: int = 512) -> list[ScoredPair]:
  """Segments and scores every response; scorer calls of `chunk` conversations span pairs.

  A pair with a segment the scorer could not score (NaN, e.g. a prefix
  longer than the attribute model's `score.max_len`) is left out.
  """
  if mode not in MODES:
    raise ConfigError(f"segment score mode {mode!r}; choose one of {MODES}")
  jobs = []  # (pair index, side, segments, number of prefixes)
  convs: list[Conversation] = []
  for i, pair in enumerate(pairs):
    for side, text in (("chosen", pair.chosen), ("rejected", pair.rejected)):
      spans = segment.split_sentences(text)
      prefixes = prefix_conversations(pair.prompt, text, spans)
      jobs.append((i, side, [text[a:b] for a, b in spans], len(prefixes)))
      convs += prefixes
  scores = predict(convs, scorer, chunk)[:, _HELPSTEER]
  built: dict[int, dict[str, ScoredResponse]] = {}
  pos = 0
  for i, side, segs, count in jobs:
    block = scores[pos:pos + count]
    pos += count
    text = getattr(pairs[i], side)
    built.setdefault(i, {})[side] = ScoredResponse(text, tuple(segs),
                                                   _segment_scores(block, mode, score_max))
  return [ScoredPair(p.prompt, built[i]["chosen"], built[i]["rejected"], p.source)
          for i, p in enumerate(pairs)
          if not any(np.isnan(r.scores).any() for r in built[i].values())]
