"""The engine's KV cache: its buffers, the shared write slot and when to re-lay them out.

The buffers are per layer and per block of `row_block` rows
([block, kv_heads, slots, head_dim] each, `engine_steps.empty_caches`). Every
row writes the same slot at each step (`end`); a row's tokens occupy
`[row_start, end)`. The slot count is one of `engine_steps.length_buckets`:
when `end` would run past the buffers, a newcomer's prompt is longer than
`end`, or the live rows span far fewer slots than the buffers hold, `fit`
rolls the buffers so that the longest live row starts at slot 0 and resizes
them to the smallest slot count that holds it and one more chunk.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import numpy as np
from jax.sharding import Mesh

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.inference import engine_steps

NOTHING = np.iinfo(np.int32).max // 2  # a free row's start: no slot visible


class SlotCache:
  """`rows` rows of keys and values sharing the write slot `end`."""

  def __init__(self, cfg, mesh: Mesh, rules: sharding_lib.Rules, *, rows: int,
               row_block: int, max_length: int, chunk_steps: int, dtype):
    self.mesh, self.row_block, self.chunk_steps = mesh, row_block, chunk_steps
    self.sharding = engine_steps.cache_sharding(mesh, rules)
    self.lengths = engine_steps.length_buckets(max_length, chunk_steps)
    self.length = self.lengths[0]
    self.k, self.v = engine_steps.empty_caches(cfg, rows, row_block, self.length, dtype,
                                               self.sharding)
    self.end = 0
    self.row_start = np.full(rows, NOTHING, np.int32)
    out = (self.sharding, self.sharding)
    # Partials, so that each cache's compiles are its own (jit caches per function object).
    self._insert = jax.jit(functools.partial(engine_steps.insert), donate_argnums=(0, 1),
                           out_shardings=out)
    # One buffer per call, so that a re-layout holds one buffer twice, not the whole cache
    # (a resize cannot reuse its input buffer; a shift at the same slot count does).
    self._relayout = jax.jit(functools.partial(engine_steps.relayout), static_argnames="length",
                             out_shardings=self.sharding)
    self._shift = jax.jit(functools.partial(engine_steps.relayout), static_argnames="length",
                          out_shardings=self.sharding, donate_argnums=0)

  @property
  def compiled_variants(self) -> int:
    return (self._insert._cache_size() + self._relayout._cache_size()
            + self._shift._cache_size())

  def warm_up_programs(self, prompt_buckets) -> int:
    """The programs `warm_up` compiles: an insert per prompt bucket and slot count that
    fits it, a re-layout per pair of slot counts (a shift where they are the same)."""
    inserts = sum(length >= t + self.chunk_steps for t in prompt_buckets
                  for length in self.lengths)
    return inserts + len(self.lengths) ** 2

  def warm_up(self, prompt_buckets, prefilled,
              on_step: Callable[[], None] = lambda: None) -> None:
    """Compiles every re-layout between slot counts and, with `prefilled(t)` giving a
    prompt bucket's per-layer keys and values, every insert that fits; `on_step()` after
    each program."""
    for t in prompt_buckets:
      ks, vs = prefilled(t)
      for length in self.lengths:
        if length >= t + self.chunk_steps:
          self.resize(length, 0)
          self.end = t
          self.insert(ks, vs, 0, t)
          on_step()
    for length in self.lengths:
      for other in self.lengths:
        self.resize(length, 0)
        self.resize(other, 0)
        # One re-layout at a time: dispatched back to back, each would hold its input
        # and output buffers at once (the largest slot counts set the server's peak).
        jax.block_until_ready((self.k, self.v))
        on_step()
    self.reset()

  def reset(self) -> None:
    """No rows, the smallest slot count, the write slot at 0: the layout a fresh cache
    has, so that what follows does not depend on what came before."""
    if self.length != self.lengths[0]:
      self.resize(self.lengths[0], 0)
    self.end = 0
    self.row_start[:] = NOTHING

  def resize(self, length: int, shift: int) -> None:
    """Moves every row's slots by `shift` and gives the buffers `length` slots."""
    move = self._shift if length == self.length else self._relayout
    with jax.set_mesh(self.mesh):
      for buffers in (self.k, self.v):
        for blocks in buffers:
          for j, x in enumerate(blocks):
            blocks[j] = move(x, np.int32(shift), length=length)
            del x  # the old buffer goes as soon as its re-layout has run
    self.length = length

  def occupied(self, busy: np.ndarray) -> int:
    """Slots the longest of the `busy` rows spans."""
    return int(max(self.end - self.row_start[busy], default=0))

  def fit(self, busy: np.ndarray, min_end: int = 0) -> bool:
    """Re-lays the buffers out, if needed, so that `end >= min_end`, a chunk fits after
    `end`, and they are not far longer than the `busy` rows need; whether it moved them."""
    occupied = self.occupied(busy)
    smallest = next(n for n in self.lengths
                    if n >= max(occupied, min_end) + self.chunk_steps)
    too_long = self.lengths.index(self.length) > self.lengths.index(smallest) + 1
    if self.end >= min_end and self.end + self.chunk_steps <= self.length and not too_long:
      return False
    target_end = max(occupied, min_end)
    shift = target_end - self.end if busy.any() else 0
    length = smallest if too_long or target_end + self.chunk_steps > self.length else self.length
    moved = bool(shift) or length != self.length
    if moved:
      self.resize(length, shift)
    self.row_start = np.where(busy, self.row_start + shift, NOTHING).astype(np.int32)
    self.end = target_end
    return moved

  def insert(self, ks, vs, row: int, prompt_len: int) -> None:
    """Writes a prefilled prompt's per-layer keys and values ([1, K, T, D] each, the
    prompt right-aligned) into `row`, its last token right before `end`."""
    j, r = divmod(row, self.row_block)
    with jax.set_mesh(self.mesh):
      new_k, new_v = self._insert([k[j] for k in self.k], [v[j] for v in self.v], ks, vs,
                                  np.int32(r), np.int32(self.end))
    for layer, (k, v) in enumerate(zip(new_k, new_v)):
      self.k[layer][j], self.v[layer][j] = k, v
    self.row_start[row] = self.end - prompt_len

  def free(self, row: int) -> None:
    self.row_start[row] = NOTHING

  def blocks(self, rows: int) -> tuple[list, list]:
    """Per layer, the blocks holding rows [0, rows)."""
    blocks = -(-rows // self.row_block)
    return [k[:blocks] for k in self.k], [v[:blocks] for v in self.v]

  def put_blocks(self, ks: list, vs: list) -> None:
    """Takes back the blocks `blocks` handed out, as a step left them."""
    for layer, (k, v) in enumerate(zip(ks, vs)):
      self.k[layer][:len(k)], self.v[layer][:len(v)] = k, v
