"""Text in, text out: tokenization, stop strings and detokenization around `Sampler`.

A stop string that is one token (the SteerLM turn marker `<extra_id_1>` in
NeMo's and the demo tokenizers) becomes a stop id checked inside the decode
loop; a longer one becomes a stop sequence (its ids alone and after a
newline, as tokenizers such as SentencePiece split it differently in
context). Either way the text is finally cut at the first stop string, so
the returned text never contains it, nor an EOS token.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from helpsteer_jax.config_sections import DEFAULT_STOP_STRINGS
from helpsteer_jax.data import template
from helpsteer_jax.data.features import tokenize
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import decode
from helpsteer_jax.inference.sampling import SamplingConfig


@dataclasses.dataclass
class Completion:
  """One generated continuation. `finish_reason`: "stop" (EOS or a stop
  string) or "length" (max_new_tokens reached)."""

  text: str
  token_ids: list[int]
  finish_reason: str


def _ids(tokenizer: Any, text: str) -> list[int]:
  return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_tokens(tokenizer: Any, stop_strings: Sequence[str],
                eos_ids: Sequence[int] = ()) -> decode.StopTokens:
  """Token-level stop conditions for `stop_strings` plus the EOS ids."""
  ids, sequences = set(int(i) for i in eos_ids), set()
  newline = _ids(tokenizer, "\n")
  for s in stop_strings:
    alone = _ids(tokenizer, s)
    in_context = _ids(tokenizer, "\n" + s)
    variants = [alone]
    if in_context[: len(newline)] == newline:
      variants.append(in_context[len(newline):])
    for v in variants:
      if len(v) == 1:
        ids.add(int(v[0]))
      elif v:
        sequences.add(tuple(int(t) for t in v))
  return decode.StopTokens(ids=tuple(sorted(ids)), sequences=tuple(sorted(sequences)))


def cut_at_stop(text: str, stop_strings: Sequence[str]) -> tuple[str, bool]:
  """`text` up to the first stop string, and whether one was found."""
  cuts = [i for i in (text.find(s) for s in stop_strings if s) if i >= 0]
  return (text[: min(cuts)], True) if cuts else (text, False)


def eos_ids(tokenizer: Any, model_eos: int | Sequence[int] | None) -> tuple[int, ...]:
  """The tokenizer's EOS id and the model config's EOS id(s)."""
  found = set()
  if getattr(tokenizer, "eos_token_id", None) is not None:
    found.add(int(tokenizer.eos_token_id))
  if model_eos is not None:
    found.update(int(i) for i in ((model_eos,) if isinstance(model_eos, int) else model_eos))
  return tuple(sorted(found))


class Generator:
  """Completes text prompts with a `Sampler` and a tokenizer."""

  def __init__(self, sampler: decode.Sampler, tokenizer: Any,
               stop_strings: Sequence[str] = DEFAULT_STOP_STRINGS, add_bos: bool = True):
    self.sampler, self.tokenizer = sampler, tokenizer
    self.stop_strings = tuple(stop_strings)
    self.add_bos = add_bos
    self.eos_ids = eos_ids(tokenizer, sampler.cfg.eos_token_id)
    self.stop = stop_tokens(tokenizer, self.stop_strings, self.eos_ids)

  def encode(self, prompt: str) -> list[int]:
    """Prompt ids exactly as AC-SFT training tokenizes text (BOS, one call)."""
    pieces = [template.Piece(prompt, False)]
    return tokenize.tokenize_pieces(pieces, self.tokenizer, add_bos=self.add_bos).ids.tolist()

  def complete(self, prompts: Sequence[str], max_new_tokens: int,
               sampling: SamplingConfig = SamplingConfig(), seed: int = 0) -> list[Completion]:
    """One completion per prompt, decoded as one batch."""
    for i, p in enumerate(prompts):
      if not p:
        raise ConfigError(f"prompt {i} is empty: give some text to continue")
    result = self.sampler.generate([self.encode(p) for p in prompts], max_new_tokens,
                                   sampling=sampling, seed=seed, stop=self.stop)
    out = []
    for i in range(len(prompts)):
      ids = result.row(i)
      shown = ids[:-1] if ids and ids[-1] in self.eos_ids else ids
      text = self.tokenizer.decode(shown, skip_special_tokens=False)
      text, cut = cut_at_stop(text, self.stop_strings)
      stopped = bool(result.stopped[i]) or cut
      out.append(Completion(text, ids, "stop" if stopped else "length"))
    return out
