"""Sentence segments of a response and their token spans.

`split_sentences` cuts a response into segments that tile it exactly (each
segment keeps the whitespace that follows it): after sentence punctuation
(. ! ? and the ellipsis when whitespace follows; CJK 。！？ at once),
after every newline (so each numbered or bulleted list item is its own
segment), with fenced code blocks kept whole. Decimals ("2.5"),
abbreviations ("e.g.", "Dr."), initials ("J. Smith") and list markers
("1. ") do not end a sentence.

`token_segments` maps character spans to tokens through the tokenizer's
offsets over the full templated sequence: a token belongs to the segment
holding its first non-whitespace character (SentencePiece and byte-level
BPE glue the space before a word to the word's token).
"""

from __future__ import annotations

import bisect
import re
from typing import Sequence

import numpy as np

# Abbreviations after which a period does not end a sentence (lower case, without the dot).
ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st vs etc e.g i.e cf fig figs no nos vol approx dept est inc ltd co corp
jan feb mar apr jun jul aug sep sept oct nov dec u.s u.k a.m p.m ph.d e.t.c al
""".split())
_FENCE = re.compile(r"^[ \t]*(```|~~~)", re.M)
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*|[。！？]+[」』”’）)]*")
_CJK_END = frozenset("。！？")
_LIST_MARKER = re.compile(r"[ \t]*(\d+|[a-zA-Z]|[ivxlcdm]+)[.)]$")
_WORD_BEFORE = re.compile(r"([\w.]+)$")


def _fence_blocks(text: str) -> list[tuple[int, int]]:
  """[start, end) of each fenced code block, through the closing fence's line."""
  blocks, pos = [], 0
  while True:
    m = _FENCE.search(text, pos)
    if not m:
      return blocks
    close = re.compile(rf"^[ \t]*{re.escape(m.group(1))}[ \t]*$", re.M)
    line_end = text.find("\n", m.end())
    c = close.search(text, line_end + 1) if line_end >= 0 else None
    end = len(text) if c is None else c.end()
    blocks.append((m.start(), end))
    pos = end


def _is_sentence_end(text: str, start: int, end: int) -> bool:
  """Whether the punctuation text[start:end] ends a sentence."""
  if text[start] in _CJK_END:
    return True
  if end < len(text) and not text[end].isspace():
    return False  # "2.5", "a.b", "U.S.A"
  if text[start:end] != ".":
    return True   # ! ? … or several marks
  line_start = text.rfind("\n", 0, start) + 1
  if _LIST_MARKER.fullmatch(text[line_start:start + 1]):
    return False  # "1. ", "b) "
  m = _WORD_BEFORE.search(text, 0, start)
  if m:
    word = m.group(1)
    if word.lower() in ABBREVIATIONS or (len(word) == 1 and word.isupper()):
      return False
  return True


def _skip_space(text: str, i: int) -> int:
  while i < len(text) and text[i].isspace():
    i += 1
  return i


def split_sentences(text: str) -> list[tuple[int, int]]:
  """[start, end) character spans of the segments; they tile `text` exactly."""
  if not text:
    return []
  blocks = _fence_blocks(text)
  inside = lambda i: any(a <= i < b for a, b in blocks)
  cuts = set()
  for a, b in blocks:
    cuts.update((a, _skip_space(text, b)))
  for m in _SENTENCE_END.finditer(text):
    if not inside(m.start()) and _is_sentence_end(text, m.start(), m.end()):
      cuts.add(_skip_space(text, m.end()))
  for m in re.finditer(r"\n", text):
    if not inside(m.start()):
      cuts.add(_skip_space(text, m.end()))
  bounds = [0] + sorted(c for c in cuts if 0 < c < len(text)) + [len(text)]
  spans = [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
  # Whitespace-only pieces (indentation before a fence) join the segment before.
  merged: list[tuple[int, int]] = []
  for a, b in spans:
    if merged and not text[a:b].strip():
      merged[-1] = (merged[-1][0], b)
    else:
      merged.append((a, b))
  return merged


def segment_texts(text: str) -> list[str]:
  return [text[a:b] for a, b in split_sentences(text)]


def spans_of(text: str, segments: Sequence[str]) -> list[tuple[int, int]] | None:
  """Spans of `segments` if they tile `text` exactly (in order), else None; an empty
  response is one empty segment (its end-of-turn tokens belong to it)."""
  if not text and list(segments) == [""]:
    return [(0, 0)]
  if "".join(segments) != text or any(not s for s in segments):
    return None
  ends = np.cumsum([len(s) for s in segments]).tolist()
  return list(zip([0] + ends[:-1], ends))


def token_segments(text: str, char_spans: np.ndarray, loss_mask: np.ndarray,
                   response_start: int, spans: Sequence[tuple[int, int]]) -> np.ndarray:
  """Per-token segment ids (1..S) of the response's loss tokens; 0 elsewhere.

  text: the full templated sequence; char_spans: [n, 2] token offsets into it
  (-1 for added tokens such as BOS); loss_mask: [n] the response's loss
  tokens; spans: the segments' spans relative to the response, starting at
  `response_start` in `text`. Loss tokens after the response text (its
  end-of-turn marker) belong to the last segment.
  """
  starts = [response_start + a for a, _ in spans]
  out = np.zeros(len(char_spans), np.int32)
  for i, (a, b) in enumerate(np.asarray(char_spans).tolist()):
    if not loss_mask[i] or a < 0:
      continue
    p = a
    while p < b - 1 and text[p].isspace():
      p += 1
    out[i] = max(bisect.bisect_right(starts, p), 1)
  return out
