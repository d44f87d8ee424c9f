"""A conversation -> the attribute model's input ids: NeMo's regression text
(`template.regression_pieces`), tokenized and fitted to a length, what training
(`features.rm`) and every scorer read; and a conversation's labels as a vector."""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from helpsteer_jax.data import template
from helpsteer_jax.data.features import tokenize
from helpsteer_jax.data.records import ATTRIBUTES, IGNORE_LABEL, Conversation


def label_vector(attributes: Mapping[str, int] | None) -> np.ndarray:
  """[9] float32 in ATTRIBUTES order; -100 where an attribute is missing."""
  out = np.full(len(ATTRIBUTES), IGNORE_LABEL, np.float32)
  for i, name in enumerate(ATTRIBUTES):
    if attributes and name in attributes:
      out[i] = attributes[name]
  return out


def regression_ids(conv: Conversation, tokenizer, max_len: int, truncation: str = "truncate_left",
                   add_bos: bool = True) -> tuple[np.ndarray | None, bool]:
  """(token ids ending in `<extra_id_2>`, truncated?) or (None, False) if dropped."""
  example = tokenize.tokenize_pieces(template.regression_pieces(conv), tokenizer,
                                     add_bos=add_bos, source=conv.source)
  fitted = tokenize.truncate(example, max_len, truncation)
  if fitted is None:
    return None, False
  return fitted.ids, len(fitted.ids) < len(example.ids)


@dataclasses.dataclass(frozen=True)
class RegressionTokenizer:
  """How conversations become regression ids (for scoring)."""
  tokenizer: object
  max_len: int
  truncation: str = "truncate_left"
  add_bos: bool = True

  def ids(self, conv: Conversation) -> np.ndarray | None:
    """The ids, or None when the conversation cannot fit."""
    return regression_ids(conv, self.tokenizer, self.max_len, self.truncation, self.add_bos)[0]
