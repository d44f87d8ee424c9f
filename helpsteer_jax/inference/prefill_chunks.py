"""Chunked prefill's plan: which waiting prompts ride on a round's decode steps, and as
which chunks (`engine_steps.PrefillChunk`).

A round has `chunk_steps` steps and each carries at most one chunk of `chunk` tokens.
Waiting prompts are taken in order, each on consecutive steps, while the round has
steps left; a prompt's row joins the decoding right after its last chunk (its `join`
step). The prompt is left-padded to whole chunks and placed so that its last token lands
right before the slot its row writes at `join`: the row's tokens stay contiguous, and its
own decode writes before `join` (at slots `end .. end + join - 1`) fall inside its last
chunk (`chunk >= chunk_steps`), which overwrites them.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from helpsteer_jax.inference.engine_steps import PrefillChunk


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
  """`chunk` tokens per step, `chunk_steps` steps per round, rows of `max_length`."""

  chunk: int
  chunk_steps: int
  max_length: int

  def count(self, prompt_len: int) -> int | None:
    """How many chunks prefill a prompt; None if they do not fit one round (it is then
    prefilled alone)."""
    count = -(-prompt_len // self.chunk)
    fits = count <= self.chunk_steps and count * self.chunk <= self.max_length
    return count if fits else None

  def joins(self, prompt_lens: dict[int, int]) -> dict[int, int]:
    """{row: the step its row joins at} for the prompts (row -> length, in waiting order)
    this round holds: first come, first taken, none skipped."""
    joins, used = {}, 0
    for row, length in prompt_lens.items():
      count = self.count(length)
      if used + count > self.chunk_steps:
        break
      used += count
      joins[row] = used
    return joins

  def min_end(self, prompt_lens: Sequence[int]) -> int:
    """The write slot a round needs at its start so that every chunk's slots exist."""
    return max(self.count(n) * self.chunk for n in prompt_lens)

  def chunks(self, ids: Sequence[int], row: int, join: int, end: int, pad_id: int
             ) -> dict[int, PrefillChunk]:
    """{step: chunk} of prompt `ids` for `row`, joining at step `join` of a round that
    starts at write slot `end`."""
    count, c = self.count(len(ids)), self.chunk
    pad = count * c - len(ids)
    padded = np.full(count * c, pad_id, np.int32)
    padded[pad:] = ids
    prompt_slot = end + join - len(ids)
    out = {}
    for index in range(count):
      span = np.arange(index * c, (index + 1) * c, dtype=np.int32)
      out[join - count + index] = PrefillChunk(
          tokens=padded[span], positions=np.maximum(span - pad, 0).astype(np.int32),
          slot=np.int32(prompt_slot - pad + index * c), row=np.int32(row),
          row_start=np.int32(prompt_slot), last=np.int32(index == count - 1))
    return out
