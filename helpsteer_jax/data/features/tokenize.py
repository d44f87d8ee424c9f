"""Template pieces -> token ids with a per-token loss mask; truncation; what was cut.

`FeatureReport` is what every featurizer returns next to its examples: how
many records were kept, truncated, or dropped and why.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Sequence

import numpy as np

from helpsteer_jax.data.template import LABEL_START, TURN_START, Piece
from helpsteer_jax.errors import ConfigError

TRUNCATION_POLICIES = ("drop", "truncate_left")

# Why a featurizer drops a record (FeatureReport.dropped keys).
DROP_REASONS = {
    "too_long": "too long",
    "too_many_segments": "more segments than max_segments",
    "no_loss": "without loss tokens",
    "no_labels": "without attribute labels",
    "tie": "ties",
}


@dataclasses.dataclass
class FeatureReport:
  """What became of the records on their way to training examples.

  `unit` names a record ("examples", "pairs"); `loss_tokens` counts what
  carries loss (tokens for SFT, labels for regression, pairs for BT).
  """

  unit: str = "examples"
  kept: int = 0
  truncated: int = 0
  tokens: int = 0
  loss_tokens: int = 0
  dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)

  def keep(self, tokens: int, loss_tokens: int, truncated: bool) -> None:
    self.kept += 1
    self.tokens += int(tokens)
    self.loss_tokens += int(loss_tokens)
    self.truncated += int(truncated)

  def drop(self, reason: str) -> None:
    if reason not in DROP_REASONS:
      raise ValueError(f"unknown drop reason {reason!r}; known: {sorted(DROP_REASONS)}")
    self.dropped[reason] += 1

  def summary(self) -> str:
    dropped = ", ".join(f"{DROP_REASONS[r]} {n}" for r, n in self.dropped.items()) or "none"
    return (f"{self.kept} {self.unit} ({self.tokens} tokens, {self.loss_tokens} with loss);"
            f" truncated {self.truncated}; dropped: {dropped}")

  def as_dict(self) -> dict:
    """For summary.json."""
    return {"kept": self.kept, "truncated": self.truncated, "tokens": self.tokens,
            "loss_tokens": self.loss_tokens, "dropped": dict(self.dropped)}


@dataclasses.dataclass(frozen=True)
class TokenizedExample:
  """Token ids and their loss mask.

  `loss_mask[i]` is True where token i is a training target (predicted from
  token i-1). `has_bos`: ids[0] is a BOS token that truncation keeps.
  `protected_start`: the first token `truncate_left` must keep (the header of
  the last response); None means the start of the last run of targets.
  `char_spans`: [n, 2] character offsets of each token in the joined text
  ((-1, -1) for an added BOS).
  """
  ids: np.ndarray
  loss_mask: np.ndarray
  source: str = ""
  has_bos: bool = False
  protected_start: int | None = None
  char_spans: np.ndarray | None = None

  def __len__(self) -> int:
    return len(self.ids)


def _protected_piece(pieces: Sequence[Piece]) -> int | None:
  """Index of the first piece of the last response with its name and label."""
  last = max((i for i, p in enumerate(pieces) if p.loss and p.text), default=None)
  if last is None:
    return None
  i = last
  while i > 0 and (pieces[i - 1].loss or not pieces[i - 1].text):
    i -= 1
  if i > 0 and pieces[i - 1].text.startswith(LABEL_START):
    i -= 1
  if i > 0 and pieces[i - 1].text.startswith(TURN_START):
    i -= 1
  return i


def tokenize_pieces(pieces: Sequence[Piece], tokenizer: Any, add_bos: bool = True,
                    *, source: str = "") -> TokenizedExample:
  """Tokenizes the joined text once and flags each token by its piece.

  The whole string is tokenized in one call (SentencePiece adds a dummy
  prefix at every call, so piece-by-piece ids would differ from the ids the
  model sees at generation). Boundary rule: a token belongs to the piece
  that holds its first character (its offset start), so a token spanning
  two pieces takes the flag of the piece it starts in. A BOS token (no loss)
  is prepended when `add_bos` and the tokenizer has one.
  """
  text = "".join(p.text for p in pieces)
  try:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
  except NotImplementedError as e:
    raise ConfigError(f"tokenize_pieces needs a fast (tokenizers-backed) tokenizer"
                      f" that returns offsets: {e}") from e
  ids = np.asarray(enc["input_ids"], np.int32).reshape(-1)
  spans = np.asarray(enc["offset_mapping"], np.int64).reshape(-1, 2)
  starts = spans[:, 0]
  ends = np.cumsum([len(p.text) for p in pieces])
  # Piece j holds characters [ends[j-1], ends[j]); empty pieces hold none.
  piece_of = np.minimum(np.searchsorted(ends, starts, side="right"), max(len(pieces) - 1, 0))
  flags = np.asarray([p.loss for p in pieces] or [False], bool)
  loss = flags[piece_of] if len(ids) else np.zeros(0, bool)
  protected = _protected_piece(pieces)
  protected_start = (None if protected is None
                     else int(np.searchsorted(piece_of, protected, side="left")))
  bos = getattr(tokenizer, "bos_token_id", None) if add_bos else None
  if bos is not None:
    ids = np.concatenate([np.asarray([bos], np.int32), ids])
    loss = np.concatenate([[False], loss])
    protected_start = None if protected_start is None else protected_start + 1
    spans = np.concatenate([np.full((1, 2), -1, np.int64), spans])
  return TokenizedExample(ids=ids, loss_mask=loss.astype(bool), source=source,
                          has_bos=bos is not None, protected_start=protected_start,
                          char_spans=spans)


def _last_target_run_start(mask: np.ndarray) -> int | None:
  hits = np.flatnonzero(mask)
  if not len(hits):
    return None
  i = int(hits[-1])
  while i > 0 and mask[i - 1]:
    i -= 1
  return i


def truncate(example: TokenizedExample, max_length: int,
             policy: str) -> TokenizedExample | None:
  """Fits an example into `max_length` tokens, or returns None.

  "drop": None when too long. "truncate_left": drops context tokens from the
  left (after BOS, which stays), keeping everything from `protected_start`
  (the last response with its name and label prefix) on; None when that
  part does not fit. The first kept token after the cut loses its loss flag,
  since the token it was predicted from is gone.
  """
  if policy not in TRUNCATION_POLICIES:
    raise ConfigError(f"unknown truncation policy {policy!r}; use one of {TRUNCATION_POLICIES}")
  if max_length < 1:
    raise ConfigError(f"max_length must be positive, got {max_length}")
  n = len(example.ids)
  if n <= max_length:
    return example
  if policy == "drop":
    return None
  head = 1 if example.has_bos else 0
  cut = n - (max_length - head)  # first kept token after the head
  protected = example.protected_start
  if protected is None:
    protected = _last_target_run_start(example.loss_mask)
  if protected is not None and protected < cut:
    return None
  ids = np.concatenate([example.ids[:head], example.ids[cut:]])
  mask = np.concatenate([example.loss_mask[:head], example.loss_mask[cut:]])
  if len(mask) > head:
    mask[head] = False
  spans = example.char_spans
  if spans is not None:
    spans = np.concatenate([spans[:head], spans[cut:]])
  return dataclasses.replace(
      example, ids=ids, loss_mask=mask, char_spans=spans,
      protected_start=None if protected is None else protected - cut + head)
