"""Continuous batching for a server: requests share decode steps in one KV cache.

The cache has a fixed number of rows (slots) and a fixed length. As in
`decode.Sampler`, every row writes the same cache slot at each step, so a
step is one `dynamic_update_slice`; a row's tokens occupy the slots
`[row_start, end)` ending at the shared write slot `end` (its RoPE positions
count from its own first token). A scheduler thread:

  - admits waiting requests into free rows at chunk boundaries: each prompt
    is prefilled alone (one compiled function per prompt bucket) and its
    keys and values are written into its row so that its last prompt token
    lands right before `end`;
  - runs `decode_chunk`: `chunk_steps` decode steps in one jitted call for
    the smallest power-of-two prefix of rows holding every live one (rows are
    taken lowest first), with per-row temperature, top-p and PRNG keys
    (arrays, so greedy and sampled rows share the compile);
  - hands each request its new text, ends rows at stop tokens, stop strings
    or their token budget, and frees finished or cancelled rows.

When `end` would run past the cache, or a newcomer's prompt is longer than
`end`, the cache is re-based: rolled along its slots so the longest live row
starts at slot 0 (one compiled roll). The cache holds `max_length +
chunk_steps` slots, so after a re-base a whole chunk always fits. Every
shape is fixed: after `warm_up`, requests compile nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from typing import Any, Callable, Sequence

import jax
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import Mesh

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import engine_steps
from helpsteer_jax.inference.decode import MIN_PROMPT_BUCKET
from helpsteer_jax.inference.row_stream import RowStream, Update
from helpsteer_jax.models.kv_cache import KVCache


@dataclasses.dataclass
class DecodeRequest:
  """One completion to generate. `stop_strings` end it (and are cut from the
  text) besides the engine's stop ids; `on_update(update)` is called from the
  scheduler thread with each piece of new text."""

  prompt_ids: Sequence[int]
  max_tokens: int
  on_update: Callable[["Update"], None]
  temperature: float = 0.0
  top_p: float = 1.0
  seed: int = 0
  stop_strings: tuple[str, ...] = ()


class Handle:
  """A submitted request; `cancel()` frees its row at the next chunk boundary."""

  def __init__(self, request: DecodeRequest):
    self.request = request
    self.cancelled = False

  def cancel(self) -> None:
    self.cancelled = True


@dataclasses.dataclass
class _Row:
  """A live row: its request and its output stream."""

  handle: Handle
  stream: RowStream

  @property
  def request(self) -> DecodeRequest:
    return self.handle.request


class Engine:
  """Serves `DecodeRequest`s from a model with a fixed-shape batched KV cache.

  `max_batch` rows, prompts + completions of at most `max_length` tokens,
  `chunk_steps` decode steps per scheduling round. `stop_ids` (EOS and
  one-token stop strings) end a row; `stop_strings` are cut from every text.
  """

  def __init__(self, model: nnx.Module, mesh: Mesh, tokenizer: Any, *,
               rules: sharding_lib.Rules = sharding_lib.DEFAULT_RULES, max_batch: int = 16,
               max_length: int = 2048, chunk_steps: int = 8, pad_id: int = 0,
               stop_ids: Sequence[int] = (), eos_ids: Sequence[int] = (),
               stop_strings: Sequence[str] = ()):
    cfg = model.cfg
    if max_batch < 1 or chunk_steps < 1:
      raise ConfigError(f"max_batch={max_batch} and chunk_steps={chunk_steps} must be >= 1")
    if not MIN_PROMPT_BUCKET <= max_length <= cfg.max_position_embeddings:
      raise ConfigError(f"max_length={max_length} must be in {MIN_PROMPT_BUCKET}.."
                        f"{cfg.max_position_embeddings} (the model's max_position_embeddings)")
    batch_shards = sharding_lib.spec_shard_count(
        sharding_lib.logical_to_spec(("batch",), rules), mesh, 0)
    if batch_shards != 1:
      raise ConfigError(f"the server shards the model over mesh.tensor; the mesh splits the"
                        f" batch {batch_shards} ways: set mesh.data=1 and mesh.fsdp=1")
    self.cfg, self.mesh, self.rules, self.tokenizer = cfg, mesh, rules, tokenizer
    self.max_batch, self.max_length, self.chunk_steps = max_batch, max_length, chunk_steps
    self.pad_id = int(pad_id)
    self.stop_ids = frozenset(int(i) for i in stop_ids) | frozenset(int(i) for i in eos_ids)
    self.eos_ids = frozenset(int(i) for i in eos_ids)
    self.stop_strings = tuple(stop_strings)
    self.buckets = engine_steps.prompt_buckets(max_length)
    self.row_buckets = engine_steps.row_buckets(max_batch)
    self.slots = max_length + chunk_steps
    graphdef, self.state = nnx.split(model)
    jit = functools.partial(dict, graphdef=graphdef, rules=rules)
    self._prefill = jax.jit(functools.partial(engine_steps.prefill_row, **jit()),
                            donate_argnums=(1, 2))
    self._decode = jax.jit(
        functools.partial(engine_steps.decode_chunk, steps=chunk_steps, **jit()),
        donate_argnums=(1, 2))
    self._roll = jax.jit(engine_steps.roll_rows, donate_argnums=(0, 1))
    with jax.set_mesh(mesh), sharding_lib.axis_rules(rules):
      empty = jax.jit(lambda: KVCache.init(cfg, max_batch, self.slots))()
    self.k, self.v = empty.k, empty.v
    self.end = 0  # the shared write slot
    self.rows: list[_Row | None] = [None] * max_batch
    self.row_start = np.full(max_batch, self.slots, np.int32)  # nothing visible
    self.positions = np.zeros(max_batch, np.int32)
    self.last = np.zeros(max_batch, np.int32)
    self.temperature = np.zeros(max_batch, np.float32)
    self.top_p = np.ones(max_batch, np.float32)
    self.counters = np.zeros(max_batch, np.int32)
    self.seeds = np.zeros(max_batch, np.uint32)
    self.waiting: collections.deque[Handle] = collections.deque()
    self.cond = threading.Condition()
    self.stopping = False
    self.stats = {"requests": 0, "chunks": 0, "rebases": 0, "generated_tokens": 0,
                  "cancelled": 0}
    self._thread: threading.Thread | None = None

  # -- compiled shapes ---------------------------------------------------------

  @property
  def compiled_variants(self) -> int:
    """Compiled variants of the engine's functions (fixed after `warm_up`)."""
    return sum(f._cache_size() for f in (self._prefill, self._decode, self._roll))

  def warm_up(self) -> None:
    """Compiles every prompt bucket's prefill, every row bucket's decode chunk and the
    re-base."""
    self.end = self.max_length
    for t in self.buckets:
      self._run_prefill([self.pad_id], 0, 0.0, 1.0, 0, t)
    for n in self.row_buckets:
      self._run_decode(n)
    with jax.set_mesh(self.mesh):
      self.k, self.v = self._roll(self.k, self.v, np.int32(0))
    self.end = 0

  def check(self, prompt_len: int, max_tokens: int) -> None:
    """ValueError unless a prompt of `prompt_len` tokens + `max_tokens` fits a row."""
    if prompt_len < 1:
      raise ValueError("the prompt is empty")
    if max_tokens < 1:
      raise ValueError(f"max_tokens={max_tokens} must be at least 1")
    if prompt_len + max_tokens > self.max_length:
      raise ValueError(f"the prompt has {prompt_len} tokens; with max_tokens={max_tokens}"
                       f" that exceeds the context length {self.max_length}")

  # -- submitting --------------------------------------------------------------

  def start(self) -> None:
    self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
    self._thread.start()

  def submit(self, request: DecodeRequest) -> Handle:
    """Queues `request` (checked first: ValueError if it cannot fit)."""
    self.check(len(request.prompt_ids), request.max_tokens)
    handle = Handle(request)
    with self.cond:
      if self.stopping:
        raise RuntimeError("the engine is shutting down")
      self.waiting.append(handle)
      self.stats["requests"] += 1
      self.cond.notify()
    return handle

  def stop(self, timeout: float | None = None) -> None:
    """Finishes the requests already submitted, then stops the scheduler."""
    with self.cond:
      self.stopping = True
      self.cond.notify()
    if self._thread is not None:
      self._thread.join(timeout)

  @property
  def busy_rows(self) -> int:
    return sum(r is not None for r in self.rows)

  # -- the scheduler -------------------------------------------------------------

  def _loop(self) -> None:
    while True:
      with self.cond:
        while not self.waiting and not self.busy_rows and not self.stopping:
          self.cond.wait()
        if self.stopping and not self.waiting and not self.busy_rows:
          return
        free = [i for i, r in enumerate(self.rows) if r is None]
        newcomers = [self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))]
      try:
        self._admit(newcomers, free)
        if self.busy_rows:
          self._step()
      except Exception as e:  # noqa: BLE001 - every waiting client must hear of it
        logging.exception("engine failure")
        self._fail_all(e)

  def _fail_all(self, error: Exception) -> None:
    for i, row in enumerate(self.rows):
      if row is not None:
        row.request.on_update(Update("", len(row.stream.ids), "error", str(error)))
        self._free(i)

  def _free(self, i: int) -> None:
    self.rows[i] = None
    self.row_start[i] = self.slots

  def _occupied(self) -> int:
    """Slots the longest live row spans."""
    live = [self.end - int(self.row_start[i]) for i, r in enumerate(self.rows) if r is not None]
    return max(live, default=0)

  def _rebase(self, target_end: int) -> None:
    shift = target_end - self.end
    if shift == 0:
      return
    if not self.busy_rows:  # nothing live to move
      self.end = target_end
      return
    with jax.set_mesh(self.mesh):
      self.k, self.v = self._roll(self.k, self.v, np.int32(shift))
    busy = np.asarray([r is not None for r in self.rows])
    self.row_start = np.where(busy, self.row_start + shift, self.slots).astype(np.int32)
    self.end = target_end
    self.stats["rebases"] += 1

  def _bucket(self, n: int) -> int:
    return next(b for b in self.buckets if b >= n)

  def _run_prefill(self, ids: Sequence[int], row: int, temperature: float, top_p: float,
                   seed: int, bucket: int) -> int:
    tokens = np.full((1, bucket), self.pad_id, np.int32)
    tokens[0, bucket - len(ids):] = ids
    with jax.set_mesh(self.mesh):
      self.k, self.v, first = self._prefill(
          self.state, self.k, self.v, tokens, np.int32(len(ids)), np.int32(row),
          np.int32(self.end), np.float32(temperature), np.float32(top_p), np.uint32(seed))
    return int(first)

  def _admit(self, newcomers: list[Handle], free: list[int]) -> None:
    for handle, i in zip(newcomers, free):
      req = handle.request
      if handle.cancelled:
        self.stats["cancelled"] += 1
        continue
      bucket = self._bucket(len(req.prompt_ids))
      if self.end < bucket or self.end + self.chunk_steps > self.slots:
        self._rebase(max(self._occupied(), bucket))
      first = self._run_prefill(req.prompt_ids, i, req.temperature, req.top_p, req.seed, bucket)
      self.rows[i] = _Row(handle, RowStream(self.tokenizer, req.max_tokens, self.stop_ids,
                                            self.eos_ids,
                                            self.stop_strings + tuple(req.stop_strings)))
      self.row_start[i] = self.end - len(req.prompt_ids)
      self.positions[i] = len(req.prompt_ids)
      self.temperature[i], self.top_p[i] = req.temperature, req.top_p
      self.seeds[i], self.counters[i] = np.uint32(req.seed), 1
      self.last[i] = first
      self._deliver(i, [first])

  def _run_decode(self, n: int) -> np.ndarray:
    """A decode chunk for rows [0, n): tokens [n, chunk_steps]."""
    with jax.set_mesh(self.mesh):
      self.k, self.v, tokens = self._decode(
          self.state, self.k, self.v, np.int32(self.end),
          *(a[:n] for a in (self.row_start, self.last, self.positions, self.temperature,
                            self.top_p, self.seeds, self.counters)))
    return np.asarray(jax.device_get(tokens))

  def _step(self) -> None:
    for i, row in enumerate(self.rows):
      if row is not None and row.handle.cancelled:
        self.stats["cancelled"] += 1
        self.stats["generated_tokens"] += len(row.stream.ids)
        self._free(i)
    if not self.busy_rows:
      return
    if self.end + self.chunk_steps > self.slots:
      self._rebase(self._occupied())
    # Rows are taken lowest first, so the live ones sit in a prefix of the cache.
    live = max(i for i, r in enumerate(self.rows) if r is not None) + 1
    n = next(b for b in self.row_buckets if b >= live)
    tokens = self._run_decode(n)
    self.end += self.chunk_steps
    self.positions[:n] += self.chunk_steps
    self.counters[:n] += self.chunk_steps
    self.last[:n] = tokens[:, -1]
    self.stats["chunks"] += 1
    for i, row in enumerate(self.rows[:n]):
      if row is not None:
        self._deliver(i, tokens[i].tolist())

  def _deliver(self, i: int, new: list[int]) -> None:
    """Feeds a row's new tokens to its stream; sends its update; frees it when finished."""
    row = self.rows[i]
    update = row.stream.add(new)
    if update is not None:
      row.request.on_update(update)
    if row.stream.finished:
      self.stats["generated_tokens"] += len(row.stream.ids)
      self._free(i)
