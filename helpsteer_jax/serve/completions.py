"""The legacy completions dialect: prompts in every form OpenAI's API takes, echo, and
log-probabilities in its `logprobs` object (vLLM's behaviour where OpenAI's is silent).

A prompt is a string, a list of strings (a batch), a list of token ids or a
list of such lists; a string is encoded as the tokenizer itself encodes it.
Log-probabilities are the model's own (`inference.sampling.raw_logprobs`):
each token's, and a dict of the `logprobs` most likely tokens (plus the
token itself when it is not among them) keyed by each one's decoded text.
With `echo`, the prompt's tokens come first, the first one without a
log-probability. `text_offset` indexes the choice's `text`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

from helpsteer_jax.inference.row_stream import TokenLogprobs
from helpsteer_jax.serve.protocol import ApiError

LOWEST_LOGPROB = -9999.0  # what OpenAI's API sends for -inf (JSON has no infinity)
FORMS = ("give a string, a list of strings, a list of token ids or a list of lists of"
         " token ids")


def token_texts(tokenizer: Any) -> Callable[[int], str]:
  """Each token id's text (the tokenizer's decode of that id alone, as vLLM's), cached."""
  return functools.lru_cache(maxsize=1 << 16)(
      lambda t: tokenizer.decode([t], skip_special_tokens=False))


def _is_ids(x: Any) -> bool:
  return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                     for t in x)


def _checked_ids(ids: list[int], vocab: int, where: str) -> list[int]:
  if not ids:
    raise ApiError(f"{where}: the prompt is empty", param="prompt")
  bad = [t for t in ids if not 0 <= t < vocab]
  if bad:
    raise ApiError(f"{where}: token id {bad[0]} is out of the vocabulary (0..{vocab - 1})",
                   param="prompt")
  return ids


def prompts(prompt: Any, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
            vocab: int) -> list[tuple[list[int], str]]:
  """The request's prompts as (token ids, text): one per string or id list."""
  if isinstance(prompt, str):
    prompt = [prompt]
  elif _is_ids(prompt) and prompt:
    prompt = [prompt]
  if not isinstance(prompt, list) or not prompt:
    raise ApiError(f"prompt: {FORMS}" + ("" if isinstance(prompt, list) else
                                         f", not {type(prompt).__name__}"), param="prompt")
  out = []
  for i, p in enumerate(prompt):
    where = "prompt" if len(prompt) == 1 else f"prompt[{i}]"
    if isinstance(p, str):
      if not p:
        raise ApiError(f"{where}: the prompt is empty", param="prompt")
      out.append((_checked_ids(list(encode(p)), vocab, where), p))
    elif _is_ids(p):
      out.append((_checked_ids(p, vocab, where), decode(p)))
    else:
      raise ApiError(f"{where}: {FORMS}", param="prompt")
  return out


def _top(chosen_id: int, chosen: float, ids: np.ndarray, top: np.ndarray, k: int,
         text: Callable[[int], str]) -> dict[str, float]:
  out = {text(int(t)): max(float(lp), LOWEST_LOGPROB) for t, lp in zip(ids[:k], top[:k])}
  out.setdefault(text(chosen_id), max(float(chosen), LOWEST_LOGPROB))
  return out


def logprobs_object(k: int, text: Callable[[int], str],
                    parts: Sequence[tuple[Sequence[int], TokenLogprobs | None]]) -> dict:
  """OpenAI's legacy `logprobs` of the tokens of `parts` in order: (ids, the raw
  log-probabilities of the last len(raw.chosen) of them; the ones before have none)."""
  tokens, token_logprobs, tops, offsets = [], [], [], []
  offset = 0
  for ids, raw in parts:
    for i, t in enumerate(ids):
      at = -1 if raw is None else i - (len(ids) - len(raw.chosen))
      tokens.append(text(int(t)))
      offsets.append(offset)
      offset += len(tokens[-1])
      if at < 0:
        token_logprobs.append(None)
        tops.append(None)
      else:
        token_logprobs.append(max(float(raw.chosen[at]), LOWEST_LOGPROB))
        tops.append(_top(int(t), raw.chosen[at], raw.top_ids[at], raw.top[at], k, text))
  return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops,
          "text_offset": offsets}
