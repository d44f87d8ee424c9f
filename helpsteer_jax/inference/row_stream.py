"""One engine request and its row's output as it streams: token ids in, text updates out.

A row ends at a stop id (EOS, a one-token stop string), at a stop string in
its text (cut there, and its ids cut to the shortest prefix holding it) or
at its token budget. Text that might be the start of a stop string, or a
character still being decoded, is held back until it is known not to be.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from helpsteer_jax.data.template import END_OF_TURN


@dataclasses.dataclass
class TokenLogprobs:
  """The model's own log-probabilities of T tokens (`sampling.raw_logprobs`): each token's
  `chosen` [T], and the most likely ids `top_ids` and their log-probabilities `top`
  [T, MAX_LOGPROBS], most likely first."""

  chosen: np.ndarray
  top_ids: np.ndarray
  top: np.ndarray

  @classmethod
  def concat(cls, parts: Sequence["TokenLogprobs"], length: int) -> "TokenLogprobs":
    """The first `length` tokens of `parts` joined."""
    return cls(*(np.concatenate([getattr(p, f) for p in parts])[:length]
                 for f in ("chosen", "top_ids", "top")))


@dataclasses.dataclass
class Update:
  """New text since the last update; `finish_reason` ("stop" / "length", or "error" and
  "abort" (a shutdown) with the message as `text`) and
  the final `text` on the last one, with the completion's `token_ids` and their `raw`
  log-probabilities. `completion_tokens` counts tokens so far."""

  delta: str
  completion_tokens: int
  finish_reason: str | None = None
  text: str = ""
  token_ids: list[int] | None = None
  raw: TokenLogprobs | None = None


@dataclasses.dataclass
class DecodeRequest:
  """One completion to generate. `stop_strings` end it (and are cut from the
  text) besides the engine's stop ids; `on_update(update)`, if given, is
  called from the scheduler with each piece of new text. `top_k = 0` and
  `top_p = 1` are off; `temperature = 0` is greedy."""

  prompt_ids: Sequence[int]
  max_tokens: int
  on_update: Callable[[Update], None] | None = None
  temperature: float = 0.0
  top_p: float = 1.0
  top_k: int = 0
  seed: int = 0
  stop_strings: tuple[str, ...] = ()


@dataclasses.dataclass
class Output:
  """A finished request: its token ids (through the stop token or the token that
  completed a stop string), each one's log-probability under the distribution it
  was drawn from, the text (stop strings and EOS cut), "stop" / "length", and the
  tokens' log-probabilities under the model's own distribution (`raw`)."""

  token_ids: list[int]
  logprobs: list[float]
  text: str
  finish_reason: str
  raw: TokenLogprobs


class Handle:
  """A submitted request; `cancel()` frees its row at the next chunk boundary."""

  def __init__(self, request: DecodeRequest):
    self.request = request
    self.cancelled = False
    self.output: Output | None = None  # set when it finishes

  def cancel(self) -> None:
    self.cancelled = True


def cut_at_stop(text: str, stop_strings: Sequence[str]) -> tuple[str, bool]:
  """`text` up to the first stop string, and whether one was found."""
  cuts = [i for i in (text.find(s) for s in stop_strings if s) if i >= 0]
  return (text[: min(cuts)], True) if cuts else (text, False)


def held_back(text: str, stops: Sequence[str]) -> int:
  """How many trailing characters might start a stop string (not shown yet)."""
  keep = 1 if text.endswith("\ufffd") else 0  # a character still being decoded
  for s in stops:
    for n in range(min(len(s), len(text)), 0, -1):
      if s.startswith(text[-n:]):
        keep = max(keep, n)
        break
  return keep


class RowStream:
  """The tokens of one completion and the text shown of them so far (no text, and no
  stop strings, without a tokenizer)."""

  def __init__(self, tokenizer: Any, max_tokens: int, stop_ids: frozenset[int],
               eos_ids: frozenset[int], stop_strings: Sequence[str]):
    self.tokenizer, self.max_tokens = tokenizer, max_tokens
    self.stop_ids, self.eos_ids = stop_ids, eos_ids
    self.stop_strings = tuple(stop_strings)
    # A chat reply drops the turn end before the stop marker: hold it back too.
    self.held_back = self.stop_strings + tuple(END_OF_TURN + s for s in self.stop_strings)
    self.ids: list[int] = []
    self.emitted = ""
    self.finished = False

  def add(self, new: Sequence[int]) -> Update | None:
    """Appends new tokens; the update to send (the last one when `finished`), if any."""
    finish = None
    for t in new:
      self.ids.append(int(t))
      if t in self.stop_ids:
        finish = "stop"
        break
      if len(self.ids) >= self.max_tokens:
        finish = "length"
        break
    text, cut = cut_at_stop(self._decode(self.ids), self.stop_strings)
    if cut:
      finish = "stop"
      self.ids = self._ids_to_stop()
    if finish is None:
      visible = text[:len(text) - held_back(text, self.held_back)]
      if len(visible) > len(self.emitted) and visible.startswith(self.emitted):
        update = Update(visible[len(self.emitted):], len(self.ids))
        self.emitted = visible
        return update
      return None
    self.finished = True
    delta = text[len(self.emitted):] if text.startswith(self.emitted) else ""
    return Update(delta, len(self.ids), finish, text)

  def _decode(self, ids: list[int]) -> str:
    if self.tokenizer is None:
      return ""
    shown = ids[:-1] if ids and ids[-1] in self.eos_ids else ids
    return self.tokenizer.decode(shown, skip_special_tokens=False)

  def _ids_to_stop(self) -> list[int]:
    """The shortest prefix of the ids whose text holds a stop string."""
    for n in range(1, len(self.ids) + 1):
      text = self.tokenizer.decode(self.ids[:n], skip_special_tokens=False)
      if cut_at_stop(text, self.stop_strings)[1]:
        return self.ids[:n]
    return self.ids
