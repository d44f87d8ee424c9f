"""The engine's compiled functions: per-layer weights and caches, one call per decode step.

Decoding reads every weight once per step. With the layers stacked on a
leading axis (as training keeps them), XLA:CPU copies each layer's slice
out of the stack before its matmuls, so a step moved the weights twice; the
engine therefore holds the layers unstacked (`Unstacked`, one state per
layer) and runs them unrolled, and keeps one key and one value buffer per
layer, [rows, kv_heads, slots, head_dim], so attention reads a layer's cache
in place. The rows are split into blocks (`row_block`) with their own
buffers, so a step over the first rows updates whole buffers in place.

Every row writes the same slot at each step (`end`, shared): a row's tokens
occupy `[row_start, end)` and its RoPE positions count from its own first
token. The buffers' slot count is one of a few lengths (`length_buckets`),
re-laid out (`relayout`) as the live rows' span grows and shrinks, so
attention costs what the live context costs, not the longest one allowed.
Each function takes the weights as arguments, so shapes, not weights, key
the compile.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.inference import sampling as sampling_lib
from helpsteer_jax.models import attention as attention_lib
from helpsteer_jax.models.live_attention import live_attention
from helpsteer_jax.models.rope import rope_tables

MIN_PROMPT_BUCKET = 16
LIVE_BLOCK = 64  # slots per block of decode attention (`live_attention`)
MIN_LENGTH_BUCKET = 128


def _doubling(first: int, last: int) -> list[int]:
  out, n = [], first
  while n < last:
    out.append(n)
    n *= 2
  return out + [last]


def prompt_buckets(max_length: int) -> list[int]:
  """Prompt lengths compiled for prefill: powers of two from 16, then `max_length`."""
  return _doubling(MIN_PROMPT_BUCKET, max_length)


def length_buckets(max_length: int, chunk_steps: int) -> list[int]:
  """Cache slot counts: powers of two from 128 up to `max_length`, each plus one chunk
  (a chunk's writes always fit after a re-base)."""
  return [n + chunk_steps for n in _doubling(min(MIN_LENGTH_BUCKET, max_length), max_length)]


ROW_BLOCK = 16


def row_block(max_batch: int, batch_shards: int = 1) -> int:
  """Rows per cache buffer: `ROW_BLOCK` when that divides `max_batch` (on an unsharded
  batch), else all of them."""
  if batch_shards == 1 and max_batch > ROW_BLOCK and max_batch % ROW_BLOCK == 0:
    return ROW_BLOCK
  return max_batch


def row_buckets(max_batch: int, block: int | None = None, first: int = 1) -> list[int]:
  """Row counts compiled for decode: `first`, x4 up to a block, then x4 in whole blocks
  up to `max_batch`."""
  block = block or max_batch
  out, n = [], min(first, max_batch)
  while n < block:
    out.append(n)
    n *= 4
  n = block
  while n < max_batch:
    out.append(n)
    n *= 4
  return out + [max_batch]


def fewest_rows(dtype, platform: str) -> int:
  """The smallest row bucket: 2 for bf16 on CPU, where XLA:CPU runs a one-row bf16 matmul
  on a path several times slower than two rows' (docs/results.md), else 1."""
  return 2 if platform == "cpu" and jnp.dtype(dtype) == jnp.bfloat16 else 1


@dataclasses.dataclass(frozen=True)
class Unstacked:
  """How to rebuild a `Decoder` whose layers are held one state per layer.

  `split(model)` returns this (static: graph definitions and per-layer
  windows) and the arrays: the non-layer state and the list of layer states.
  `model(rest, layers)` merges the non-layer state with layer 0's state in
  the layers' place; only its embedding, final norm and head are used.
  """

  graphdef: Any
  layer_graphdef: Any
  windows: tuple[int | None, ...]

  @classmethod
  def split(cls, model: nnx.Module) -> tuple["Unstacked", dict, list]:
    graphdef, state = nnx.split(model)
    layer_graphdef, stacked = nnx.split(model.layers)
    n = model.cfg.num_layers
    layers = [jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(n)]
    rest = {k: v for k, v in state.items() if k != "layers"}
    pattern = model.cfg.window_pattern()
    windows = tuple(pattern[i % len(pattern)] for i in range(n))
    return cls(graphdef, layer_graphdef, windows), rest, layers

  def model(self, rest: dict, layers: list) -> nnx.Module:
    return nnx.merge(self.graphdef, nnx.State({**rest, "layers": layers[0]}))

  def layer(self, state) -> nnx.Module:
    return nnx.merge(self.layer_graphdef, state)


def _layers_forward(unstacked: Unstacked, layer_states, x, cos, sin, attend):
  """Runs the layers unrolled; `attend(i, attn_module, q, k, v, window)` -> [B, T, H, D]."""
  for i, state in enumerate(layer_states):
    layer = unstacked.layer(state)
    with jax.named_scope("decoder_layer"):
      h = layer.input_norm(x)
      q, k, v = layer.attn.project_qkv(h, cos, sin)
      out = attend(i, layer.attn, q, k, v, unstacked.windows[i])
      x = layer.add_mlp(x, layer.attn.output(out))
  return x


def _heads_first(x: jax.Array, dtype) -> jax.Array:
  """[B, T, K, D] -> [B, K, T, D] in the cache dtype."""
  return x.transpose(0, 2, 1, 3).astype(dtype)


def _prompt_forward(unstacked: Unstacked, rest, layers, tokens, length, on_kv=None):
  """The model and the final-norm hidden states [1, T, hidden] of one left-padded prompt
  [1, T] of `length` tokens; `on_kv(k, v)` sees each layer's keys and values."""
  model = unstacked.model(rest, layers)
  t = tokens.shape[1]
  index = jnp.arange(t, dtype=jnp.int32)[None]
  pad = t - length
  segment_ids = (index >= pad).astype(jnp.int32)
  positions = jnp.maximum(index - pad, 0)
  cos, sin = rope_tables(positions, model.cfg)
  info = attention_lib.MaskInfo(segment_ids, segment_ids, 0)

  def attend(i, attn, q, k, v, window):
    if on_kv is not None:
      on_kv(k, v)
    return attn.attend(q, k, v, info, window)

  x = _layers_forward(unstacked, layers, model.embed_tokens(tokens), cos, sin, attend)
  return model, model.final_norm(x)


def prefill(rest, layers, tokens, length, temperature, top_p, top_k, seed, *,
            unstacked: Unstacked, rules, cache_dtype):
  """Runs one left-padded prompt [1, T]; returns its per-layer keys and values
  ([1, K, T, D] each), the first sampled token, its log-probability, its
  `sampling.raw_logprobs` ([] and the top [MAX_LOGPROBS] ids and log-probabilities)
  and the last position's logits [V] (`first_token` samples them again)."""
  with sharding_lib.axis_rules(rules):
    ks, vs = [], []

    def keep(k, v):
      ks.append(_heads_first(k, cache_dtype))
      vs.append(_heads_first(v, cache_dtype))

    model, hidden = _prompt_forward(unstacked, rest, layers, tokens, length, keep)
    logits = model.logits(hidden[:, -1:])[0, 0]
    first, logp, raw = first_token(logits, temperature, top_p, top_k, seed)
    return ks, vs, first, logp, raw, logits


def first_token(logits, temperature, top_p, top_k, seed):
  """A row's first token from its prompt's last logits [V], its log-probability and its
  `sampling.raw_logprobs`."""
  first, logp = sampling_lib.sample_rows(
      logits[None], jax.random.fold_in(jax.random.key(seed), 0)[None], temperature[None],
      top_p[None], top_k[None])
  raw = sampling_lib.raw_logprobs(logits[None], first)
  return first[0], logp[0], jax.tree.map(lambda a: a[0], raw)


def score(rest, layers, tokens, length, *, unstacked: Unstacked, rules, chunk: int = 256):
  """The model's log-probabilities over one left-padded prompt [1, T]: `raw_logprobs` of
  each token given the tokens before it, for tokens 1..T-1 ([T-1] and [T-1, MAX_LOGPROBS]
  ids and log-probabilities; the padding's entries are meaningless).

  The vocabulary projection runs `chunk` positions at a time, so a long prompt never
  holds [T, vocab] logits at once.
  """
  with sharding_lib.axis_rules(rules):
    model, hidden = _prompt_forward(unstacked, rest, layers, tokens, length)
    t = tokens.shape[1]
    c = math.gcd(t, chunk)
    hidden = hidden[0].reshape(t // c, c, -1)
    # Position p scores token p + 1; the last position's (wrapped) target is dropped.
    targets = jnp.roll(tokens[0], -1).reshape(t // c, c)

    def one(args):
      h, target = args
      return sampling_lib.raw_logprobs(model.logits(h[None])[0], target)

    chosen, ids, top = jax.lax.map(one, (hidden, targets))
    return chosen.reshape(t)[:-1], ids.reshape(t, -1)[:-1], top.reshape(t, -1)[:-1]


def insert(ks, vs, new_ks, new_vs, row, end):
  """Writes one prompt's per-layer keys and values into `row` of one block's per-layer
  buffers, ending at slot `end`."""
  zero = jnp.zeros((), jnp.int32)
  t = new_ks[0].shape[2]
  at = (row, zero, end - t, zero)
  return ([jax.lax.dynamic_update_slice(k, n, at) for k, n in zip(ks, new_ks)],
          [jax.lax.dynamic_update_slice(v, n, at) for v, n in zip(vs, new_vs)])


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PrefillChunk:
  """`C` tokens of one newcomer's prompt, computed within a decode step (chunked prefill).

  tokens, positions: [C] int32, the chunk's ids and RoPE positions (left padding of a
    prompt's first chunk: any id, position 0; its keys land left of `row_start`).
  slot: the cache slot of token 0; row: the row whose buffers receive the keys and values;
  row_start: the slot of the prompt's first token (what the chunk's queries may see from);
  last: 1 when the chunk ends the prompt: the step samples the row's first token from its
    last position instead of decoding the row.
  """

  tokens: jax.Array
  positions: jax.Array
  slot: jax.Array
  row: jax.Array
  row_start: jax.Array
  last: jax.Array


def _write_chunk(blocks: list, new: jax.Array, chunk: PrefillChunk) -> list:
  """Writes a chunk's keys or values [1, K, C, D] into `chunk.row` of whichever of the
  `blocks` ([block, K, S, D] each) holds it, at `chunk.slot`: every block rewrites only that
  row's window, with its old contents unless the row is its own."""
  block = blocks[0].shape[0]
  local, owner = chunk.row % block, chunk.row // block
  zero = jnp.zeros((), jnp.int32)
  at = (local, zero, chunk.slot, zero)
  out = []
  for j, b in enumerate(blocks):
    if len(blocks) > 1:
      new_j = jnp.where(owner == j, new, jax.lax.dynamic_slice(b, at, new.shape))
    else:
      new_j = new
    out.append(jax.lax.dynamic_update_slice(b, new_j, at))
  return out


def _read_row(blocks: list, row: jax.Array) -> jax.Array:
  """Row `row`'s buffer [1, K, S, D] out of the `blocks` holding it."""
  block, zero = blocks[0].shape[0], jnp.zeros((), jnp.int32)
  shape = (1,) + blocks[0].shape[1:]
  rows = [jax.lax.dynamic_slice(b, (row % block, zero, zero, zero), shape) for b in blocks]
  if len(rows) == 1:
    return rows[0]
  return jnp.select([row // block == j for j in range(len(rows))], rows)


def decode_step(rest, layers, ks, vs, end, row_start, last, positions, temperature, top_p,
                top_k, seeds, counters, chunk: PrefillChunk | None = None, *,
                unstacked: Unstacked, rules, in_place: bool = True):
  """One decode step for the first `n = len(row_start)` rows (per-row sampling settings
  and PRNG streams); returns the caches' new keys and values and, for those rows, the
  new tokens [n], their log-probabilities [n] (`sampling.sample_rows`) and their
  `sampling.raw_logprobs` ([n] and the top [n, MAX_LOGPROBS] ids and log-probabilities).

  `ks`, `vs`: per layer, the row blocks holding those rows ([block, K, S, D] each).
  Only those rows are computed: with few requests live, a step costs what
  their rows cost, not the whole cache's. `in_place`: the new slot is written
  into the blocks and they are returned; otherwise (1 < n < block) the
  buffers are only read and the step returns the new slot's per-layer keys
  and values [n, K, 1, D] for `write_slot`: reading a slice of rows of a
  buffer the same program updates made XLA copy every buffer (for one row,
  or whole blocks, it does not).

  `chunk` (in place only): a newcomer's prompt chunk rides along. Its `C`
  tokens join the rows' tokens in every weight matmul ([n + C] rows: the
  weights are read once for both), write their keys and values into its row
  after the decode write (so a newcomer row's own decode writes, which land
  inside its last chunk's slots, are overwritten) and attend to the row's
  cache causally. The LM head runs on the n rows and the chunk's last
  position only; on the prompt's last chunk the row's token is sampled from
  that position (its counter is 0, as `first_token`'s).
  """
  with sharding_lib.axis_rules(rules):
    model = unstacked.model(rest, layers)
    n, block = row_start.shape[0], ks[0][0].shape[0]
    slots = jnp.arange(ks[0][0].shape[2], dtype=jnp.int32)[None]
    filled = ((slots >= row_start[:, None]) & (slots <= end)).astype(jnp.int32)
    ones = jnp.ones((n, 1), jnp.int32)
    tokens = last
    if chunk is not None:
      if not in_place:
        raise ValueError("a prefill chunk rides only on an in-place step")
      tokens = jnp.concatenate([last, chunk.tokens])
      positions = jnp.concatenate([positions, chunk.positions])
      c = chunk.tokens.shape[0]
      chunk_info = attention_lib.MaskInfo(
          jnp.ones((1, c), jnp.int32), (slots >= chunk.row_start).astype(jnp.int32),
          chunk.slot)
    cos, sin = rope_tables(positions[:, None], model.cfg)
    zero = jnp.zeros((), jnp.int32)
    at = (zero, zero, end, zero)
    new_ks, new_vs = [list(k) for k in ks], [list(v) for v in vs]

    def attend(i, attn, q, k, v, window):
      k, v = _heads_first(k, ks[i][0].dtype), _heads_first(v, vs[i][0].dtype)
      knobs = attn.knobs(window)
      if not in_place:
        new_ks[i], new_vs[i] = k, v
        k_cache = jax.lax.dynamic_update_slice(ks[i][0][:n], k, at)
        v_cache = jax.lax.dynamic_update_slice(vs[i][0][:n], v, at)
        info = attention_lib.MaskInfo(ones, filled, end)
        return attention_lib.cached_attention(q, k_cache, v_cache, info, **knobs)
      outs = []
      for j in range(len(ks[i])):
        rows = slice(j * block, min(n, (j + 1) * block))
        new_ks[i][j] = k_cache = jax.lax.dynamic_update_slice(ks[i][j], k[rows], at)
        new_vs[i][j] = v_cache = jax.lax.dynamic_update_slice(vs[i][j], v[rows], at)
        if n < block:
          k_cache, v_cache = k_cache[:n], v_cache[:n]
        info = attention_lib.MaskInfo(ones[rows], filled[rows], end)
        if n < block:  # one row: the loop's overhead costs more than the slots it skips
          outs.append(attention_lib.cached_attention(q[rows], k_cache, v_cache, info, **knobs))
          continue
        # Only the slots from the block's oldest live row on are read (a free row's
        # start is past every slot).
        outs.append(live_attention(q[rows], k_cache, v_cache, info, jnp.min(row_start[rows]),
                                   block=LIVE_BLOCK, **knobs))
      if chunk is not None:
        # The chunk's C tokens sit on the batch axis, one each, as the rows' do:
        # [C, K, 1, D] -> [1, K, C, D].
        new_ks[i] = _write_chunk(new_ks[i], k[n:, :, 0].transpose(1, 0, 2)[None], chunk)
        new_vs[i] = _write_chunk(new_vs[i], v[n:, :, 0].transpose(1, 0, 2)[None], chunk)
        out = attention_lib.cached_attention(
            q[n:, 0][None], _read_row(new_ks[i], chunk.row), _read_row(new_vs[i], chunk.row),
            chunk_info, **knobs)
        outs.append(out[0][:, None])
      return jnp.concatenate(outs) if len(outs) > 1 else outs[0]

    x = _layers_forward(unstacked, layers, model.embed_tokens(tokens[:, None]), cos, sin,
                        attend)
    hidden = model.final_norm(x[:n] if chunk is None else
                              jnp.concatenate([x[:n], x[-1:]]))  # the head's rows only
    keys = jax.vmap(lambda s, c: jax.random.fold_in(jax.random.key(s), c))(seeds, counters)
    logits = model.logits(hidden)[:, 0]
    if chunk is not None:
      first = (jnp.arange(n) == chunk.row) & (chunk.last != 0)
      logits = jnp.where(first[:, None], logits[n][None], logits[:n])
    new, logp = sampling_lib.sample_rows(logits, keys, temperature, top_p, top_k)
    return new_ks, new_vs, new, logp, sampling_lib.raw_logprobs(logits, new)


def write_slot(ks, vs, new_ks, new_vs, end):
  """Writes a step's per-layer keys and values of the first n rows ([n, K, 1, D]) into
  slot `end` of the first block (`ks`, `vs`: per layer, [that block]; in place when
  donated)."""
  zero = jnp.zeros((), jnp.int32)
  at = (zero, zero, end, zero)
  return ([[jax.lax.dynamic_update_slice(k[0], n, at)] for k, n in zip(ks, new_ks)],
          [[jax.lax.dynamic_update_slice(v[0], n, at)] for v, n in zip(vs, new_vs)])


def relayout(x, shift, *, length: int):
  """Moves every row's slots of one buffer [rows, K, S, D] right by `shift` (negative:
  left) and gives it `length` slots; slots moved past either end are free ones."""
  have = x.shape[2]
  if length > have:  # grow first, so that nothing live wraps around
    x = jnp.pad(x, ((0, 0), (0, 0), (0, length - have), (0, 0)))
  return jnp.roll(x, shift, axis=2)[:, :, :length]


def cache_sharding(mesh, rules) -> jax.sharding.NamedSharding:
  """How a layer's [rows, kv_heads, slots, head_dim] buffer lies on the mesh."""
  spec = sharding_lib.logical_to_spec(("batch", "kv_heads", "length", "head_dim"), rules)
  return jax.sharding.NamedSharding(mesh, spec)


def empty_caches(cfg, rows: int, block: int, length: int, dtype,
                 sharding: jax.sharding.NamedSharding) -> tuple[list, list]:
  """Zeroed key and value buffers, per layer and per block of `block` rows
  ([block, kv_heads, length, head_dim] each)."""
  shape = (block, cfg.num_kv_heads, length, cfg.head_dim)
  zeros = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)
  # One call per buffer: each must be its own (donated) array.
  blocks = rows // block
  return ([[zeros() for _ in range(blocks)] for _ in range(cfg.num_layers)],
          [[zeros() for _ in range(blocks)] for _ in range(cfg.num_layers)])
