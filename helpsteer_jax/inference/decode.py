"""Batched autoregressive decoding: prefill, then a `lax.while_loop` of steps.

Prompts of different lengths are left-padded to one bucketed length, so all
rows write the same cache slot at each step and every row's last prompt
token sits at the same index; each row keeps its own RoPE positions
(position 0 at its first real token). One jitted function does the prefill
and the whole decode loop; it is compiled once per (batch bucket, prompt
bucket, max_new_tokens, sampling, stop tokens) and then reused, with no
host round trip per token. The loop ends when every row has produced a stop
token (or matched a stop sequence) or after `max_new_tokens`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import sampling as sampling_lib
from helpsteer_jax.models import kv_cache
from helpsteer_jax.models.kv_cache import KVCache

MIN_PROMPT_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class StopTokens:
  """Token-level end conditions: single ids (EOS, one-token stop strings) and
  multi-token sequences (stop strings the tokenizer splits)."""

  ids: tuple[int, ...] = ()
  sequences: tuple[tuple[int, ...], ...] = ()


@dataclasses.dataclass
class DecodeResult:
  """Generated ids [batch, max_new_tokens] (pad after the end), per-row
  lengths including the stop token, and whether a stop condition ended it."""

  tokens: np.ndarray
  lengths: np.ndarray
  stopped: np.ndarray

  def row(self, i: int) -> list[int]:
    return self.tokens[i, : self.lengths[i]].tolist()


def _bucket(n: int, minimum: int) -> int:
  return max(minimum, 1 << max(n - 1, 0).bit_length())


def _matches_stop(new: jax.Array, out: jax.Array, step: jax.Array,
                  stop: StopTokens) -> jax.Array:
  """[batch] bool: the token just written at `step` ends the row."""
  hit = jnp.isin(new, jnp.asarray(stop.ids or (-1,), jnp.int32))
  for seq in stop.sequences:
    n = len(seq)
    start = jnp.maximum(step - n + 1, 0)
    tail = jax.lax.dynamic_slice_in_dim(out, start, n, axis=1)
    hit |= (step + 1 >= n) & jnp.all(tail == jnp.asarray(seq, jnp.int32), axis=1)
  return hit


def _generate(state, tokens, prompt_lengths, key, *, graphdef, rules, pad_id,
              max_new_tokens: int, sampling: sampling_lib.SamplingConfig, stop: StopTokens):
  with sharding_lib.axis_rules(rules):
    model = nnx.merge(graphdef, state)
    batch, prompt_len = tokens.shape
    pad = prompt_len - prompt_lengths
    index = jnp.arange(prompt_len, dtype=jnp.int32)[None]
    segment_ids = (index >= pad[:, None]).astype(jnp.int32)
    positions = jnp.maximum(index - pad[:, None], 0)
    cache = KVCache.init(model.cfg, batch, prompt_len + max_new_tokens)
    hidden, cache = kv_cache.prefill(model, tokens, positions, segment_ids, cache)
    first = sampling_lib.next_token(model.logits(hidden[:, -1:])[:, 0],
                                    jax.random.fold_in(key, 0), sampling)
    out = jnp.full((batch, max_new_tokens), pad_id, jnp.int32).at[:, 0].set(first)
    done = _matches_stop(first, out, jnp.int32(0), stop)
    lengths = jnp.where(done, 1, max_new_tokens).astype(jnp.int32)

    def cond(carry):
      step, _, _, _, done, _ = carry
      return (step < max_new_tokens) & ~jnp.all(done)

    def body(carry):
      step, last, cache, out, done, lengths = carry
      hidden, cache = kv_cache.decode_step(model, last[:, None],
                                           (prompt_lengths + step - 1)[:, None], cache)
      new = sampling_lib.next_token(model.logits(hidden)[:, 0],
                                    jax.random.fold_in(key, step), sampling)
      new = jnp.where(done, pad_id, new)
      out = jax.lax.dynamic_update_slice_in_dim(out, new[:, None], step, axis=1)
      ends = ~done & _matches_stop(new, out, step, stop)
      lengths = jnp.where(ends, step + 1, lengths)
      return step + 1, new, cache, out, done | ends, lengths

    carry = (jnp.int32(1), first, cache, out, done, lengths)
    _, _, _, out, done, lengths = jax.lax.while_loop(cond, body, carry)
    return out, lengths, done


class Sampler:
  """Decodes token-id prompts with a model laid out on a mesh.

  `max_length` caps prompt + new tokens (the KV cache length; default the
  model's `max_position_embeddings`). Batches are padded to at least
  `min_batch` rows (a task with a fixed batch size compiles once).
  """

  def __init__(self, model: nnx.Module, mesh: Mesh,
               rules: sharding_lib.Rules = sharding_lib.DEFAULT_RULES,
               max_length: int | None = None, pad_id: int = 0, min_batch: int = 1):
    self.cfg = model.cfg
    self.mesh, self.rules = mesh, rules
    self.max_length = int(max_length or self.cfg.max_position_embeddings)
    self.pad_id = int(pad_id)
    self.min_batch = int(min_batch)
    graphdef, self.state = nnx.split(model)
    self.batch_shards = sharding_lib.spec_shard_count(
        sharding_lib.logical_to_spec(("batch",), rules), mesh, 0)
    self.input_sharding = NamedSharding(mesh, sharding_lib.batch_spec(rules))
    self.row_sharding = NamedSharding(mesh, PartitionSpec(self.input_sharding.spec[0]))
    self.local_rows = 0  # prompts decoded on this process's devices
    # Replicated outputs: every process can read every row (multi-process runs).
    self._run = jax.jit(
        functools.partial(_generate, graphdef=graphdef, rules=rules, pad_id=self.pad_id),
        static_argnames=("max_new_tokens", "sampling", "stop"),
        out_shardings=NamedSharding(mesh, PartitionSpec()))

  @property
  def compiled_variants(self) -> int:
    """How many (bucket, settings) variants have been compiled so far."""
    return self._run._cache_size()

  def buckets(self, batch: int, longest: int, max_new_tokens: int) -> tuple[int, int]:
    """(padded batch, padded prompt length) for these inputs."""
    padded_batch = _bucket(max(batch, self.min_batch), 1)
    padded_batch = math.ceil(padded_batch / self.batch_shards) * self.batch_shards
    prompt = min(_bucket(longest, MIN_PROMPT_BUCKET), self.max_length - max_new_tokens)
    return padded_batch, prompt

  def check(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    """ConfigError for inputs the cache cannot hold (before compiling)."""
    if max_new_tokens < 1:
      raise ConfigError(f"max_new_tokens={max_new_tokens} must be at least 1")
    if not prompts:
      raise ConfigError("no prompts to decode")
    for i, p in enumerate(prompts):
      if len(p) == 0:
        raise ConfigError(f"prompt {i} is empty: give at least one token")
      if len(p) + max_new_tokens > self.max_length:
        raise ConfigError(
            f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} that"
            f" exceeds the KV cache length {self.max_length}: shorten the prompt, lower"
            " max_new_tokens or raise max_length (at most the model's"
            f" max_position_embeddings={self.cfg.max_position_embeddings})")

  def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
               sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig(),
               seed: int = 0, stop: StopTokens = StopTokens()) -> DecodeResult:
    """Generates up to `max_new_tokens` after each prompt (lists of token ids)."""
    self.check(prompts, max_new_tokens)
    batch, prompt_len = self.buckets(len(prompts), max(map(len, prompts)), max_new_tokens)
    tokens = np.full((batch, prompt_len), self.pad_id, np.int32)
    lengths = np.ones(batch, np.int32)  # filler rows: one pad token
    for i, p in enumerate(prompts):
      tokens[i, prompt_len - len(p):] = p
      lengths[i] = len(p)
    with jax.set_mesh(self.mesh):
      out, ends, done = self._run(
          self.state, jax.device_put(tokens, self.input_sharding),
          jax.device_put(lengths, self.row_sharding),
          jax.random.key(seed), max_new_tokens=int(max_new_tokens), sampling=sampling,
          stop=stop)
    out, ends, done = jax.device_get((out, ends, done))
    n = len(prompts)
    self.local_rows += sharding_lib.local_row_count(self.row_sharding, batch, n)
    return DecodeResult(np.asarray(out[:n]), np.asarray(ends[:n]), np.asarray(done[:n]))
