"""Continuous batching for a server: requests share decode steps in one KV cache.

The cache has a fixed number of rows and one of a few slot counts
(`engine_steps`: per-layer buffers, a shared write slot `end`, each row's
tokens in `[row_start, end)` with RoPE positions counted from its own first
token). A scheduler thread:

  - admits waiting requests into free rows at chunk boundaries. With no row
    decoding, each prompt is prefilled alone (one compiled function per
    prompt bucket) and its keys and values are written into its row so that
    its last prompt token lands right before `end`; while rows decode, its
    prompt is prefilled in chunks that ride on the next round's decode steps
    (chunked prefill: `prefill_chunks.ChunkPlan`), and the row joins the decoding
    mid-round;
  - runs a chunk of `chunk_steps` decode steps, one compiled call each,
    dispatched back to back (the tokens stay on the device until the chunk
    ends), for the smallest row bucket holding every live row (rows are
    taken lowest first; the buffers hold `engine_steps.row_block` rows each,
    so a bucket of whole blocks is updated in place), with per-row
    temperature, top-p and PRNG streams (arrays, so greedy and sampled rows
    share the compile);
  - hands each request its new text, ends rows at stop tokens, stop strings
    or their token budget, and frees finished or cancelled rows;
  - between chunks, scores the prompts queued by `score` (the model's
    log-probability of each prompt token, one compiled forward per bucket).

Every generated token also carries the model's own log-probability and its
top `sampling.MAX_LOGPROBS` alternatives (`Output.raw`), besides its
log-probability under the distribution it was drawn from (`Output.logprobs`).

The cache's buffers and their re-layouts are `kv_cache.SlotCache`'s. Every
shape is one of a fixed set: after `warm_up`, requests compile nothing.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from typing import Sequence

import jax
from absl import logging
from flax import nnx

from helpsteer_jax.inference import engine_steps
from helpsteer_jax.inference.engine_core import EngineCore
from helpsteer_jax.inference.row_stream import (  # noqa: F401 - the engine's API
  DecodeRequest,
  Handle,
  Output,
  RowStream,
  TokenLogprobs,
  Update,
)


class Engine(EngineCore):
  """Serves `DecodeRequest`s from a model with a fixed-shape batched KV cache.

  `max_batch` rows, prompts + completions of at most `max_length` tokens,
  `chunk_steps` decode steps per scheduling round. `stop_ids` (EOS and
  one-token stop strings) end a row; `stop_strings` are cut from every text.
  Two ways to drive it: `start` runs the scheduler thread (`submit`, `score`,
  `stop`, `abort`: a server), `generate` runs a batch to the end in the calling
  thread (tasks, RL rollouts); `load_weights` swaps the weights between batches.
  """

  # -- the scheduler thread ------------------------------------------------------

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


  def score(self, prompt_ids: Sequence[int]) -> concurrent.futures.Future:
    """The model's log-probabilities of each prompt token after the first given the ones
    before it (a future of `TokenLogprobs`, [len - 1]); the scheduler computes them
    between chunks (the calling thread, when the scheduler is not running)."""
    if not 1 <= len(prompt_ids) <= self.max_length:
      raise ValueError(f"the prompt has {len(prompt_ids)} tokens; it must have 1.."
                       f"{self.max_length}")
    future = concurrent.futures.Future()
    if self._thread is None:
      future.set_result(self._run_score(prompt_ids, self._bucket(len(prompt_ids))))
      return future
    with self.cond:
      if self.stopping:
        raise RuntimeError("the engine is shutting down")
      self.scoring.append((list(prompt_ids), future))
      self.cond.notify()
    return future


  def stop(self, timeout: float | None = None) -> None:
    """Finishes the requests already submitted, then stops the scheduler."""
    with self.cond:
      self.stopping = True
      self.cond.notify()
    if self._thread is not None:
      self._thread.join(timeout)


  def abort(self, reason: str) -> None:
    """Ends every live and waiting request now with finish_reason "abort" (`reason` as
    its text) and refuses new ones: a shutdown whose drain time ran out."""
    with self.cond:
      self.stopping = True
      self.aborting = reason
      self.cond.notify()


  def _loop(self) -> None:
    while True:
      with self.cond:
        while (not self.waiting and not self.busy_rows and not self.scoring
               and not self.stopping):
          self.cond.wait()
        if self.aborting is not None:
          unadmitted, self.waiting = list(self.waiting), collections.deque()
          self._end_all("abort", self.aborting, unadmitted)
          self.aborting = None
        if self.stopping and not self.waiting and not self.busy_rows and not self.scoring:
          return
        free = self._free_rows()
        newcomers = [self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))]
        scoring = [self.scoring.popleft() for _ in range(len(self.scoring))]
      for ids, future in scoring:  # the chunks' buffers are never touched concurrently
        try:
          future.set_result(self._run_score(ids, self._bucket(len(ids))))
        except Exception as e:  # noqa: BLE001 - the caller hears of it
          future.set_exception(e)
      try:
        self._admit(newcomers, free)
        if self.busy_rows:
          self._step()
      except Exception as e:  # noqa: BLE001 - every waiting client must hear of it
        logging.exception("engine failure")
        self._end_all("error", str(e), [h for h in newcomers if h.output is None and not any(
            r is not None and r.handle is h for r in self.rows)])


  def _end_all(self, reason: str, message: str, unadmitted: Sequence[Handle] = ()) -> None:
    """Ends every live row, and the requests not yet admitted, with a `reason` update
    ("error" or "abort") whose text is `message`."""
    ended = [(row.handle, len(row.stream.ids)) for row in self.rows if row is not None]
    for handle, tokens in ended + [(h, 0) for h in unadmitted]:
      if handle.request.on_update is not None:
        handle.request.on_update(Update("", tokens, reason, message))
    for i, row in enumerate(self.rows):
      if row is not None:
        self._free(i)


  # -- the batch API -------------------------------------------------------------

  def generate(self, requests: Sequence[DecodeRequest]) -> list[Output]:
    """Runs `requests` to the end in the calling thread; their outputs in order.

    The offline API (tasks, rollouts): the scheduler thread must not be
    running. Scheduling depends only on the requests and the tokens, so every
    process of a multi-process run makes the same decisions.
    """
    if self._thread is not None:
      raise RuntimeError("generate() runs the scheduler itself: not after start()")
    for r in requests:
      self.check(len(r.prompt_ids), r.max_tokens)
    if not self.busy_rows:
      # Numerics follow the cache's layout (its slot count): starting from a fresh one,
      # the same requests give the same log-probabilities bit for bit, whatever the
      # engine decoded before (a resumed run's rollouts equal an uninterrupted run's).
      self.cache.reset()
    handles = collections.deque(Handle(r) for r in requests)
    done = list(handles)
    while handles or self.busy_rows:
      free = self._free_rows()
      self._admit([handles.popleft() for _ in range(min(len(free), len(handles)))], free)
      if self.busy_rows:
        self._step()
    self.stats["requests"] += len(done)
    return [h.output for h in done]


  # -- the weight swap -------------------------------------------------------------

  def load_weights(self, model: nnx.Module) -> None:
    """Decodes with `model`'s weights from now on: a policy after a training update.
    Its arrays must match the current ones in shape, dtype and sharding, so nothing
    recompiles; no row may be live (call it between `generate` calls)."""
    if self.busy_rows:
      raise RuntimeError("load_weights with rows still decoding: call it between requests")
    _, rest, layers = engine_steps.Unstacked.split(model)

    def signature(tree):
      return jax.tree.map(lambda a: (a.shape, a.dtype, a.sharding), tree)

    if signature((rest, layers)) != signature((self.rest, self.layers)):
      raise ValueError("load_weights: the model's arrays differ in shape, dtype or sharding"
                       " from the engine's (a different architecture or mesh)")
    self.rest, self.layers = rest, layers

