"""The engine's decoding core: compiled functions, the KV cache's rows and their state.

`EngineCore` holds what every way of driving the engine shares (`inference.engine`:
the scheduler thread of a server, the batch API of tasks and rollouts): the compiled
prefill, first-token, decode and scoring functions over the model's per-layer weights
(`engine_steps`), the cache (`kv_cache.SlotCache`), each row's request, stream and
sampling state, and the steps that move them: admitting requests into free rows
(one prefill per distinct prompt when nothing decodes; else prefill chunks planned
onto the next round's steps), a chunk of decode steps for the smallest row bucket
that holds every live row, delivering tokens to each row's stream and freeing
finished rows. Every shape is one of a fixed set: after `warm_up`, nothing compiles.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import threading
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import engine_steps, kv_cache, prefill_chunks
from helpsteer_jax.inference.row_stream import (
  DecodeRequest,
  Handle,
  Output,
  RowStream,
  TokenLogprobs,
)


@dataclasses.dataclass
class _Row:
  """A live row: its request and its output stream."""

  handle: Handle
  stream: RowStream
  logprobs: list[float] = dataclasses.field(default_factory=list)
  raw: list[TokenLogprobs] = dataclasses.field(default_factory=list)
  pending: bool = False  # its prompt is still to be prefilled in chunks

  @property
  def request(self) -> DecodeRequest:
    return self.handle.request


class EngineCore:
  """The decoding state of `Engine` (see `inference.engine`): a model with a fixed-shape
  batched KV cache.

  `max_batch` rows, prompts + completions of at most `max_length` tokens,
  `chunk_steps` decode steps per scheduling round. `stop_ids` (EOS and
  one-token stop strings) end a row; `stop_strings` are cut from every text.
  `prefill_chunk`: while rows decode, a newcomer's prompt is prefilled
  `prefill_chunk` tokens per decode step, within the running rows' steps
  (0: every prompt is prefilled alone between rounds).
  """

  def __init__(self, model: nnx.Module, mesh: Mesh, tokenizer: Any, *,
               rules: sharding_lib.Rules = sharding_lib.DEFAULT_RULES, max_batch: int = 16,
               max_length: int = 2048, chunk_steps: int = 8, pad_id: int = 0,
               stop_ids: Sequence[int] = (), eos_ids: Sequence[int] = (),
               stop_strings: Sequence[str] = (), prefill_chunk: int = 64):
    cfg = model.cfg
    if max_batch < 1 or chunk_steps < 1:
      raise ConfigError(f"max_batch={max_batch} and chunk_steps={chunk_steps} must be >= 1")
    if prefill_chunk and prefill_chunk < chunk_steps:
      raise ConfigError(f"prefill_chunk={prefill_chunk} must be at least chunk_steps="
                        f"{chunk_steps} (a prompt's last chunk covers the slots its row's"
                        " steps wrote before it), or 0 to prefill every prompt alone")
    if not engine_steps.MIN_PROMPT_BUCKET <= max_length <= cfg.max_position_embeddings:
      raise ConfigError(f"max_length={max_length} must be in {engine_steps.MIN_PROMPT_BUCKET}.."
                        f"{cfg.max_position_embeddings} (the model's max_position_embeddings)")
    self.batch_shards = sharding_lib.spec_shard_count(
        sharding_lib.logical_to_spec(("batch",), rules), mesh, 0)
    if max_batch % self.batch_shards:
      raise ConfigError(f"max_batch={max_batch} rows cannot split over the mesh's"
                        f" {self.batch_shards} batch shards (mesh.data x mesh.fsdp): choose a"
                        f" multiple of {self.batch_shards}")
    self.cfg, self.mesh, self.rules, self.tokenizer = cfg, mesh, rules, tokenizer
    self.max_batch, self.max_length, self.chunk_steps = max_batch, max_length, chunk_steps
    self.prefill_chunk = min(prefill_chunk, max_length) if max_batch > 1 else 0
    self.plan = prefill_chunks.ChunkPlan(self.prefill_chunk, chunk_steps, max_length)
    if self.prefill_chunk and self.prefill_chunk < chunk_steps:
      raise ConfigError(f"max_length={max_length} is shorter than chunk_steps={chunk_steps}:"
                        " set prefill_chunk=0")
    self.pad_id = int(pad_id)
    self.stop_ids = frozenset(int(i) for i in stop_ids) | frozenset(int(i) for i in eos_ids)
    self.eos_ids = frozenset(int(i) for i in eos_ids)
    self.stop_strings = tuple(stop_strings)
    self.buckets = engine_steps.prompt_buckets(max_length)
    # A batch-sharded cache decodes all its rows (a row prefix is not local to any
    # shard), and rows are handed out round-robin over the shards so that every
    # process's devices decode their share.
    self.row_block = engine_steps.row_block(max_batch, self.batch_shards)
    platform = mesh.devices.flat[0].platform
    first = engine_steps.fewest_rows(cfg.compute_dtype, platform)
    self.cache_dtype = cfg.compute_dtype
    self.row_buckets = (engine_steps.row_buckets(max_batch, self.row_block, first)
                        if self.batch_shards == 1 else [max_batch])
    # A prefill chunk rides on in-place steps only: whole blocks of rows.
    self.mixed_buckets = [n for n in self.row_buckets
                          if self.prefill_chunk and n > 1 and n % self.row_block == 0]
    per_shard = max_batch // self.batch_shards
    self.row_order = [s * per_shard + j for j in range(per_shard)
                      for s in range(self.batch_shards)]
    unstacked, self.rest, self.layers = engine_steps.Unstacked.split(model)
    static = dict(unstacked=unstacked, rules=rules)
    # Fixed output shardings: every call sees inputs laid out as the last one left them,
    # so a layout never keys a new compile.
    cache = engine_steps.cache_sharding(mesh, rules)  # as `kv_cache.SlotCache` lays it out
    self.local_row = np.zeros(max_batch, bool)
    for index in cache.addressable_devices_indices_map(
        (self.row_block, cfg.num_kv_heads, 1, cfg.head_dim)).values():
      self.local_row[index[0]] = True
    self.local_rows = 0  # requests admitted into rows this process's devices hold
    self._replicated = NamedSharding(mesh, PartitionSpec())
    # A prompt is prefilled (or scored) alone: its one row is computed on every batch shard.
    one_row = sharding_lib.replicated_batch(rules)
    prompt_caches = [engine_steps.cache_sharding(mesh, one_row)] * cfg.num_layers
    self._prefill = jax.jit(
        functools.partial(engine_steps.prefill, unstacked=unstacked, rules=one_row,
                          cache_dtype=self.cache_dtype),
        out_shardings=(prompt_caches, prompt_caches) + (self._replicated,) * 4)
    self._score = jax.jit(functools.partial(engine_steps.score, unstacked=unstacked,
                                            rules=one_row),
                          out_shardings=self._replicated)
    # Partials, so that each engine's functions (and `compiled_variants`) are its own:
    # jit caches compiles per function object.
    self._first = jax.jit(functools.partial(engine_steps.first_token),
                          out_shardings=self._replicated)
    step_outputs = (cache, cache, self._replicated, self._replicated, self._replicated)
    self._decode = jax.jit(functools.partial(engine_steps.decode_step, **static),
                           donate_argnums=(2, 3), out_shardings=step_outputs)
    # 1 < rows < row_block: the step only reads the buffers, `_write` updates them.
    self._decode_rows = jax.jit(functools.partial(engine_steps.decode_step, **static,
                                                  in_place=False),
                                out_shardings=step_outputs)
    self._write = jax.jit(functools.partial(engine_steps.write_slot), donate_argnums=(0, 1),
                          out_shardings=(cache, cache))
    self.cache = kv_cache.SlotCache(cfg, mesh, rules, rows=max_batch, row_block=self.row_block,
                                    max_length=max_length, chunk_steps=chunk_steps,
                                    dtype=self.cache_dtype)
    self.rows: list[_Row | None] = [None] * max_batch
    self.positions = np.zeros(max_batch, np.int32)
    self.last = np.zeros(max_batch, np.int32)
    self.temperature = np.zeros(max_batch, np.float32)
    self.top_p = np.ones(max_batch, np.float32)
    self.top_k = np.zeros(max_batch, np.int32)
    self.counters = np.zeros(max_batch, np.int32)
    self.seeds = np.zeros(max_batch, np.uint32)
    self.waiting: collections.deque[Handle] = collections.deque()
    self.scoring: collections.deque[tuple[list[int], concurrent.futures.Future]] = (
        collections.deque())
    self.cond = threading.Condition()
    self.stopping = False
    self.aborting: str | None = None  # `abort`'s reason, until the scheduler acts on it
    self.stats = {"requests": 0, "chunks": 0, "rebases": 0, "generated_tokens": 0,
                  "cancelled": 0, "prefill_chunks": 0}
    self._thread: threading.Thread | None = None

  # -- compiled shapes ---------------------------------------------------------

  @property
  def compiled_variants(self) -> int:
    """Compiled variants of the engine's functions (fixed after `warm_up`)."""
    return self.cache.compiled_variants + sum(f._cache_size() for f in (
        self._prefill, self._first, self._decode, self._decode_rows, self._write, self._score))

  @property
  def warm_up_programs(self) -> int:
    """The programs `warm_up` compiles (or reads from the compilation cache): prefill and
    scoring per prompt bucket, the first-token sampler, per slot count a decode step per
    row bucket (a read-only step and a write below a whole block of rows) and per mixed
    bucket, and the cache's inserts and re-layouts."""
    steps = sum(1 if n == 1 or n % self.row_block == 0 else 2 for n in self.row_buckets)
    return (2 * len(self.buckets) + 1 + self.cache.warm_up_programs(self.buckets)
            + (steps + len(self.mixed_buckets)) * len(self.cache.lengths))

  def warm_up(self, on_step: Callable[[], None] = lambda: None) -> None:
    """Compiles every prompt bucket's prefill and scoring, every (rows, slots) decode step,
    the prompt inserts and the re-layouts between slot counts (`warm_up_programs` in
    all); `on_step()` after each step of it (a progress bar's cue)."""
    def prefilled(t: int):
      self._run_score([self.pad_id] * 2, t)
      ks, vs, *_, logits = self._run_prefill([self.pad_id], 0.0, 1.0, 0, 0, t)
      if t == self.buckets[0]:
        self._run_first(logits, 0.0, 1.0, 0, 0)
      on_step()
      return ks, vs

    self.cache.warm_up(self.buckets, prefilled, on_step)
    for length in self.cache.lengths:
      self.cache.resize(length, 0)
      for n in self.row_buckets:
        # One step each: a step compiles what a chunk of them runs.
        self._run_decode(n, steps=1)
        on_step()
        if n in self.mixed_buckets:
          dummy = self.plan.chunks([self.pad_id], 0, 1, self.prefill_chunk, self.pad_id)
          self._run_decode(n, dummy, steps=1)
          on_step()
    self.cache.reset()

  def check(self, prompt_len: int, max_tokens: int) -> None:
    """ConfigError (a ValueError) unless `prompt_len` tokens + `max_tokens` fit a row."""
    if prompt_len < 1:
      raise ConfigError("the prompt is empty")
    if max_tokens < 1:
      raise ConfigError(f"max_tokens={max_tokens} must be at least 1")
    if prompt_len + max_tokens > self.max_length:
      raise ConfigError(f"the prompt has {prompt_len} tokens; with max_tokens={max_tokens}"
                        f" that exceeds the context length {self.max_length}")

  @property
  def busy_rows(self) -> int:
    return sum(r is not None for r in self.rows)

  # -- rows: admission, decode chunks, delivery --------------------------------

  def _free_rows(self) -> list[int]:
    return [i for i in self.row_order if self.rows[i] is None]

  def _free(self, i: int) -> None:
    self.rows[i] = None
    self.cache.free(i)

  def _decoding(self) -> np.ndarray:
    """[max_batch] bool: the rows whose tokens are in the cache (not pending)."""
    return np.asarray([r is not None and not r.pending for r in self.rows])

  def _fit(self, min_end: int = 0) -> None:
    if self.cache.fit(self._decoding(), min_end):
      self.stats["rebases"] += 1

  def _bucket(self, n: int) -> int:
    return next(b for b in self.buckets if b >= n)

  def _padded(self, ids: Sequence[int], bucket: int) -> np.ndarray:
    """`ids` left-padded to [1, bucket]."""
    tokens = np.full((1, bucket), self.pad_id, np.int32)
    tokens[0, bucket - len(ids):] = ids
    return tokens

  def _run_score(self, ids: Sequence[int], bucket: int) -> TokenLogprobs:
    with jax.set_mesh(self.mesh):
      out = self._score(self.rest, self.layers, self._padded(ids, bucket), np.int32(len(ids)))
    chosen, top_ids, top = jax.device_get(out)
    at = bucket - len(ids)  # the first scored token's entry: the second prompt token's
    return TokenLogprobs(chosen[at:], top_ids[at:], top[at:])

  def _run_prefill(self, ids: Sequence[int], temperature: float, top_p: float, top_k: int,
                   seed: int, bucket: int):
    """Per-layer keys and values of `ids` left-padded to `bucket`, the first token, its
    log-probability, its raw log-probabilities and the last position's logits."""
    tokens = self._padded(ids, bucket)
    with jax.set_mesh(self.mesh):
      return self._prefill(self.rest, self.layers, tokens, np.int32(len(ids)),
                           np.float32(temperature), np.float32(top_p), np.int32(top_k),
                           np.uint32(seed))

  def _run_first(self, logits, temperature: float, top_p: float, top_k: int, seed: int):
    """Another sample of a prefilled prompt's first token, and its log-probability."""
    with jax.set_mesh(self.mesh):
      return self._first(logits, np.float32(temperature), np.float32(top_p), np.int32(top_k),
                         np.uint32(seed))

  def _admit(self, newcomers: list[Handle], free: list[int]) -> None:
    """Takes the newcomers into the free rows. While rows decode and no more prompts would
    wait for chunks than rows decode, a prompt that fits one round's chunks waits in its
    row for `_step` to prefill it within the decode steps; otherwise it is prefilled alone
    now, and requests with the same prompt (the n samples of one prompt) share one
    prefill."""
    # Chunks spare the decoding rows a stall but make the waiting prompts wait: they are
    # used while no more prompts wait for them than rows decode (a burst onto few running
    # rows is prefilled at once).
    decoding = int(self._decoding().sum()) if self.prefill_chunk else 0
    waiting = sum(r is not None and r.pending for r in self.rows)
    burst = waiting + len(newcomers) > decoding
    whole = []
    for handle, i in zip(newcomers, free):
      if handle.cancelled:
        self.stats["cancelled"] += 1
        continue
      if not burst and self.plan.count(len(handle.request.prompt_ids)) is not None:
        self._take(handle, i, pending=True)
      else:
        whole.append((handle, i))
    self._prefill_whole(whole)

  def _take(self, handle: Handle, i: int, pending: bool = False) -> _Row:
    req = handle.request
    self.local_rows += int(self.local_row[i])
    self.rows[i] = row = _Row(handle, RowStream(self.tokenizer, req.max_tokens, self.stop_ids,
                                                self.eos_ids,
                                                self.stop_strings + tuple(req.stop_strings)),
                              pending=pending)
    self.temperature[i], self.top_p[i], self.top_k[i] = req.temperature, req.top_p, req.top_k
    self.seeds[i] = np.uint32(req.seed)
    return row

  def _prefill_whole(self, admitted: list[tuple[Handle, int]]) -> None:
    """Prefills each prompt alone and writes it into its row; the rows then decode."""
    prefilled: dict[tuple[int, ...], tuple] = {}
    for handle, i in admitted:
      req = handle.request
      bucket = self._bucket(len(req.prompt_ids))
      self._fit(bucket)
      key = tuple(int(t) for t in req.prompt_ids)
      if key in prefilled:
        ks, vs, logits = prefilled[key]
        first, logp, raw = self._run_first(logits, req.temperature, req.top_p, req.top_k,
                                           req.seed)
      else:
        ks, vs, first, logp, raw, logits = self._run_prefill(
            req.prompt_ids, req.temperature, req.top_p, req.top_k, req.seed, bucket)
        prefilled[key] = ks, vs, logits
      self.cache.insert(ks, vs, i, len(req.prompt_ids))
      row = self._take(handle, i)
      first = int(first)
      row.logprobs.append(float(logp))
      row.raw.append(TokenLogprobs(*(np.asarray(a)[None] for a in jax.device_get(raw))))
      self.positions[i] = len(req.prompt_ids)
      self.counters[i] = 1
      self.last[i] = first
      self._deliver(i, [first])

  def _plan(self) -> tuple[dict[int, engine_steps.PrefillChunk], dict[int, int]]:
    """This round's prefill chunks by step and the step each newcomer's row joins the
    decoding at (`prefill_chunks.ChunkPlan`); re-lays the cache out so that every chunk's
    slots exist."""
    lengths = {i: len(r.request.prompt_ids) for i, r in enumerate(self.rows)
               if r is not None and r.pending}
    joins = self.plan.joins(lengths)
    if not joins:
      return {}, joins
    self._fit(self.plan.min_end([lengths[i] for i in joins]))
    steps = {}
    for i, join in joins.items():
      ids = self.rows[i].request.prompt_ids
      chunks = self.plan.chunks(ids, i, join, self.cache.end, self.pad_id)
      steps.update(chunks)
      self.cache.row_start[i] = self.cache.end + join - len(ids)
      self.positions[i] = len(ids) - join  # so that step `join` decodes position len(ids)
      self.counters[i] = 1 - join  # the first token's (step join - 1) is 0
      self.stats["prefill_chunks"] += len(chunks)
    return steps, joins

  def _run_decode(self, n: int, chunks: dict[int, engine_steps.PrefillChunk] | None = None,
                  steps: int | None = None) -> tuple[np.ndarray, np.ndarray, TokenLogprobs]:
    """A chunk of decode steps (`steps`, by default `chunk_steps`) for rows [0, n), with
    `chunks[i]` riding on step i: tokens and their log-probabilities, [n, steps] each,
    and their raw log-probabilities ([n, steps, ...])."""
    chunks = chunks or {}
    last = jax.device_put(self.last[:n], self._replicated)
    row_start, temperature, top_p, top_k, seeds = (a[:n] for a in (
        self.cache.row_start, self.temperature, self.top_p, self.top_k, self.seeds))
    ks, vs = self.cache.blocks(n)
    tokens, logprobs, raws = [], [], []
    with jax.set_mesh(self.mesh):
      for i in range(steps or self.chunk_steps):
        end = np.int32(self.cache.end + i)
        # A pending row's position and counter run negative before its first token.
        args = (row_start, last, np.maximum(self.positions[:n] + i, 0), temperature, top_p,
                top_k, seeds, np.maximum(self.counters[:n] + i, 0))
        if i in chunks:
          ks, vs, last, logp, raw = self._decode(self.rest, self.layers, ks, vs, end, *args,
                                                 chunks[i])
        elif n == 1 or n % self.row_block == 0:
          ks, vs, last, logp, raw = self._decode(self.rest, self.layers, ks, vs, end, *args)
        else:
          new_k, new_v, last, logp, raw = self._decode_rows(self.rest, self.layers, ks, vs,
                                                            end, *args)
          ks, vs = self._write(ks, vs, new_k, new_v, end)
        tokens.append(last)
        logprobs.append(logp)
        raws.append(raw)
    self.cache.put_blocks(ks, vs)
    tokens, logprobs, raws = jax.device_get((tokens, logprobs, raws))
    raw = TokenLogprobs(*(np.stack(a, axis=1) for a in zip(*raws)))
    return np.stack(tokens, axis=1), np.stack(logprobs, axis=1), raw

  def _step(self) -> None:
    for i, row in enumerate(self.rows):
      if row is not None and row.handle.cancelled:
        self.stats["cancelled"] += 1
        self.stats["generated_tokens"] += len(row.stream.ids)
        self._free(i)
    pending = [i for i, r in enumerate(self.rows) if r is not None and r.pending]
    if pending and not self._decoding().any():
      # Nobody to keep emitting: prefill the waiting prompts alone (shared per prompt).
      handles = [(self.rows[i].handle, i) for i in pending]
      for i in pending:
        self.rows[i] = None
        self.local_rows -= int(self.local_row[i])
      self._prefill_whole(handles)
    if not self.busy_rows:
      return
    chunks, joins = self._plan()
    if not chunks:
      self._fit()
    # Rows are taken lowest first, so the live ones sit in a prefix of the cache.
    live = max(i for i, r in enumerate(self.rows)
               if r is not None and (not r.pending or i in joins)) + 1
    buckets = self.mixed_buckets if chunks else self.row_buckets
    n = next(b for b in buckets if b >= live)
    tokens, logprobs, raw = self._run_decode(n, chunks)
    self.cache.end += self.chunk_steps
    self.positions[:n] += self.chunk_steps
    self.counters[:n] += self.chunk_steps
    self.last[:n] = tokens[:, -1]
    self.stats["chunks"] += 1
    for i, row in enumerate(self.rows[:n]):
      if row is None or (row.pending and i not in joins):
        continue
      first = joins.get(i, 1) - 1  # a newcomer's tokens start at its first token's step
      row.pending = False
      row.logprobs.extend(logprobs[i, first:].tolist())
      row.raw.append(TokenLogprobs(raw.chosen[i, first:], raw.top_ids[i, first:],
                                   raw.top[i, first:]))
      self._deliver(i, tokens[i, first:].tolist())

  def _deliver(self, i: int, new: list[int]) -> None:
    """Feeds a row's new tokens to its stream; sends its update; frees it when finished."""
    row = self.rows[i]
    update = row.stream.add(new)
    finished = row.stream.finished
    if finished:
      ids = row.stream.ids
      update.token_ids, update.raw = list(ids), TokenLogprobs.concat(row.raw, len(ids))
      row.handle.output = Output(update.token_ids, row.logprobs[:len(ids)], update.text,
                                 update.finish_reason, update.raw)
    if update is not None and row.request.on_update is not None:
      row.request.on_update(update)
    if finished:
      self.stats["generated_tokens"] += len(row.stream.ids)
      self._free(i)
