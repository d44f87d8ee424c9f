"""The Llama-family decoder as Flax NNX modules.

Layer parameters are stacked on a leading `layers` axis and the forward pass
scans over them (one traced layer, so 80-layer models compile in seconds).
The forward returns the final-norm hidden states; `Llama.logits` projects
them to the vocabulary separately so losses can fuse that projection.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from helpsteer_jax import unrollable as loops
from helpsteer_jax.models import attention as attention_lib
from helpsteer_jax.models import kv_cache
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.rope import apply_rope, rope_tables
from helpsteer_jax.models.swiglu import swiglu
from helpsteer_jax.sharding import constrain

LOGICAL_AXES = "logical_axes"


def _param(rngs: nnx.Rngs | None, shape: tuple[int, ...],
           axes: tuple[str | None, ...], cfg: ModelConfig,
           init: str = "normal") -> nnx.Param:
  dtype = cfg.weight_dtype
  if init == "normal":
    value = cfg.initializer_range * jax.random.normal(rngs.params(), shape, dtype)
  elif init == "ones":
    value = jnp.ones(shape, dtype)
  else:
    value = jnp.zeros(shape, dtype)
  return nnx.Param(value, **{LOGICAL_AXES: axes})


def _w(p: nnx.Param, dtype) -> jax.Array:
  return p[...].astype(dtype)


class RMSNorm(nnx.Module):
  """HF LlamaRMSNorm: normalise in fp32, cast back, then scale."""

  def __init__(self, dim: int, cfg: ModelConfig):
    self.eps = cfg.rms_norm_eps
    self.scale = _param(None, (dim,), ("embed",), cfg, init="ones")

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(x.dtype) * x32.astype(x.dtype)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE and optional QKV bias."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, h, k, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.q_proj = _param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), cfg)
    self.k_proj = _param(rngs, (d, k, hd), ("embed", "kv_heads", "head_dim"), cfg)
    self.v_proj = _param(rngs, (d, k, hd), ("embed", "kv_heads", "head_dim"), cfg)
    self.o_proj = _param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), cfg)
    if cfg.attention_bias:
      self.q_bias = _param(None, (h, hd), ("heads", "head_dim"), cfg, "zeros")
      self.k_bias = _param(None, (k, hd), ("kv_heads", "head_dim"), cfg, "zeros")
      self.v_bias = _param(None, (k, hd), ("kv_heads", "head_dim"), cfg, "zeros")

  def project_qkv(self, x: jax.Array, cos: jax.Array, sin: jax.Array):
    dt = self.cfg.compute_dtype
    q = jnp.einsum("btd,dhk->bthk", x, _w(self.q_proj, dt))
    k = jnp.einsum("btd,dhk->bthk", x, _w(self.k_proj, dt))
    v = jnp.einsum("btd,dhk->bthk", x, _w(self.v_proj, dt))
    if self.cfg.attention_bias:
      q = q + _w(self.q_bias, dt)
      k = k + _w(self.k_bias, dt)
      v = v + _w(self.v_bias, dt)
    q = constrain(apply_rope(q, cos, sin), ("batch", "length", "heads", "head_dim"))
    k = constrain(apply_rope(k, cos, sin), ("batch", "length", "kv_heads", "head_dim"))
    v = constrain(v, ("batch", "length", "kv_heads", "head_dim"))
    return q, k, v

  def output(self, attn: jax.Array) -> jax.Array:
    return jnp.einsum("bthk,hkd->btd", attn, _w(self.o_proj, self.cfg.compute_dtype))

  def __call__(self, x, cos, sin, info: attention_lib.MaskInfo) -> jax.Array:
    q, k, v = self.project_qkv(x, cos, sin)
    out = attention_lib.attention(q, k, v, info, self.cfg.attention_impl,
                                  self.cfg.attention_block_size)
    return self.output(out)

  def with_cache(self, x, cos, sin, info: attention_lib.MaskInfo, kv, layer, start,
                 prefill: bool):
    """Attention that also writes this call's keys and values into the cache.

    `kv` is the (keys, values) pair of stacked cache buffers. A prefill (into
    an empty cache) attends over its own tokens with the configured kernel;
    a decode step attends over the cached layer (`cached_attention`).
    """
    q, k, v = self.project_qkv(x, cos, sin)
    kv = (kv_cache.write(kv[0], layer, start, k), kv_cache.write(kv[1], layer, start, v))
    if prefill:
      out = attention_lib.attention(q, k, v, info, self.cfg.attention_impl,
                                    self.cfg.attention_block_size)
    else:
      out = attention_lib.cached_attention(
          q, kv_cache.read(kv[0], layer), kv_cache.read(kv[1], layer), info)
    return self.output(out), kv


class MLP(nnx.Module):
  """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, f = cfg.hidden_size, cfg.intermediate_size
    self.gate_proj = _param(rngs, (d, f), ("embed", "mlp"), cfg)
    self.up_proj = _param(rngs, (d, f), ("embed", "mlp"), cfg)
    self.down_proj = _param(rngs, (f, d), ("mlp", "embed"), cfg)

  def __call__(self, x: jax.Array) -> jax.Array:
    dt = self.cfg.compute_dtype
    return swiglu(x, _w(self.gate_proj, dt), _w(self.up_proj, dt), _w(self.down_proj, dt))


class DecoderLayer(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.input_norm = RMSNorm(cfg.hidden_size, cfg)
    self.attn = Attention(cfg, rngs=rngs)
    self.post_attention_norm = RMSNorm(cfg.hidden_size, cfg)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x, cos, sin, info) -> jax.Array:
    return self._add_mlp(x + self.attn(self.input_norm(x), cos, sin, info))

  def with_cache(self, x, cos, sin, info, kv, layer, start, prefill: bool):
    out, kv = self.attn.with_cache(self.input_norm(x), cos, sin, info, kv, layer, start,
                                   prefill)
    return self._add_mlp(x + out), kv

  def _add_mlp(self, x: jax.Array) -> jax.Array:
    x = x + self.mlp(self.post_attention_norm(x))
    return constrain(x, ("batch", "length", "embed"))


def _remat_policy(name: str) -> Callable | None:
  policies = jax.checkpoint_policies
  return {
      "full": policies.nothing_saveable,
      "save_dots": policies.dots_saveable,
      "save_dots_no_batch": policies.dots_with_no_batch_dims_saveable,
  }.get(name)


def _prepend_layer_axis(module: nnx.Module) -> None:
  for _, var in nnx.iter_graph(module):
    if isinstance(var, nnx.Variable) and var.has_metadata(LOGICAL_AXES):
      var.set_metadata(LOGICAL_AXES, ("layers",) + tuple(var.get_metadata(LOGICAL_AXES)))


class Llama(nnx.Module):
  """Decoder-only transformer: embeddings, scanned layers, final norm, head."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), cfg)

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_layers(layer_rngs: nnx.Rngs) -> DecoderLayer:
      return DecoderLayer(cfg, rngs=layer_rngs)

    self.layers = make_layers(rngs)
    _prepend_layer_axis(self.layers)
    self.final_norm = RMSNorm(cfg.hidden_size, cfg)
    if not cfg.tie_word_embeddings:
      self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), cfg)

  def __call__(self, tokens: jax.Array, positions: jax.Array | None = None,
               segment_ids: jax.Array | None = None) -> jax.Array:
    """Returns final-norm hidden states [batch, length, hidden].

    tokens: [B, T] ids. positions: [B, T] RoPE positions (per packed segment;
    default 0..T-1). segment_ids: [B, T], 0 = padding (default all 1).
    """
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    if segment_ids is None:
      segment_ids = jnp.ones_like(tokens)
    cos, sin = rope_tables(positions, self.cfg)
    info = attention_lib.MaskInfo(segment_ids, segment_ids, 0)
    x = self._run_layers(self._embed_tokens(tokens), cos, sin, info)
    return self.final_norm(x)

  def _embed_tokens(self, tokens: jax.Array) -> jax.Array:
    # FSDP all-gathers the embed dim for the lookup; a vocab split over the
    # tensor axis stays (SPMD turns it into masked local lookups + a sum).
    table = constrain(self.embed[...], ("vocab", None))
    x = jnp.take(table, tokens, axis=0).astype(self.cfg.compute_dtype)
    return constrain(x, ("batch", "length", "embed"))

  # -- decoding with a KV cache ------------------------------------------------

  def prefill(self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array,
              cache: kv_cache.KVCache) -> tuple[jax.Array, kv_cache.KVCache]:
    """Runs prompts [B, T] into an empty cache; returns hidden states and the cache.

    Padding tokens carry segment id 0 (left padding: every row's last prompt
    token is then at T-1). The prompt attends with the training kernels.
    """
    return self._run_cached(tokens, positions, segment_ids, cache, prefill=True)

  def decode_step(self, tokens: jax.Array, positions: jax.Array,
                  cache: kv_cache.KVCache) -> tuple[jax.Array, kv_cache.KVCache]:
    """Appends tokens [B, T] (usually T = 1) at the cache's end and attends over it."""
    return self._run_cached(tokens, positions, jnp.ones_like(tokens), cache, prefill=False)

  def _run_cached(self, tokens, positions, segment_ids, cache: kv_cache.KVCache,
                  prefill: bool) -> tuple[jax.Array, kv_cache.KVCache]:
    start = cache.end
    segment_ids = segment_ids.astype(jnp.int32)
    filled = jax.lax.dynamic_update_slice(cache.segment_ids, segment_ids, (0, start))
    # A prefill sees only its own tokens; a decode step sees every filled slot.
    info = (attention_lib.MaskInfo(segment_ids, segment_ids, 0) if prefill
            else attention_lib.MaskInfo(segment_ids, filled, start))
    cos, sin = rope_tables(positions, self.cfg)
    x = self._embed_tokens(tokens)
    graphdef, state = nnx.split(self.layers)

    # The whole cache rides in the carry and each layer writes its slice in
    # place (passing layer slices as scan inputs/outputs copies the cache).
    def body(carry, xs):
      x, kv = carry
      layer_state, i = xs
      layer = nnx.merge(graphdef, layer_state)
      return layer.with_cache(x, cos, sin, info, kv, i, start, prefill), None

    carry = (x, (cache.k, cache.v))
    layer_ids = jnp.arange(self.cfg.num_layers, dtype=jnp.int32)
    if self.cfg.scan_layers:
      carry, _ = loops.scan(body, carry, (state, layer_ids))
    else:
      for i in range(self.cfg.num_layers):
        carry, _ = body(carry, (jax.tree.map(lambda a, i=i: a[i], state), i))
    x, (k, v) = carry
    cache = kv_cache.KVCache(k=k, v=v, segment_ids=filled, end=start + tokens.shape[1])
    return self.final_norm(x), cache

  def _run_layers(self, x, cos, sin, info) -> jax.Array:
    graphdef, state = nnx.split(self.layers)

    def body(carry, layer_state):
      layer = nnx.merge(graphdef, layer_state)
      return layer(carry, cos, sin, info), None

    if self.cfg.remat_policy != "none":
      body = jax.checkpoint(body, policy=_remat_policy(self.cfg.remat_policy),
                            prevent_cse=not self.cfg.scan_layers)
    if self.cfg.scan_layers:
      x, _ = loops.scan(body, x, state)
      return x
    for i in range(self.cfg.num_layers):
      x, _ = body(x, jax.tree.map(lambda a, i=i: a[i], state))
    return x

  def head_weight(self) -> jax.Array:
    """The [hidden, vocab] output projection in compute dtype."""
    if self.cfg.tie_word_embeddings:
      return self.embed[...].astype(self.cfg.compute_dtype).T
    return self.lm_head[...].astype(self.cfg.compute_dtype)

  def logits(self, hidden: jax.Array) -> jax.Array:
    """Full-vocabulary logits in fp32: [batch, length, vocab].

    Computed over sequence chunks written into the output in place: the same
    FLOPs, but XLA keeps each chunk's matmul a plain GEMM instead of fusing
    the final norm into one huge kernel (15-20% faster on CPU).
    """
    weight = self.head_weight()
    chunk = self.cfg.logits_chunk_size
    length = hidden.shape[1]

    def project(h):
      return jnp.einsum("btd,dv->btv", h, weight, preferred_element_type=jnp.float32)

    if chunk <= 0 or length <= chunk:
      return constrain(project(hidden), ("batch", "length", "vocab"))
    n = length // chunk

    def body(i, out):
      h = jax.lax.dynamic_slice_in_dim(hidden, i * chunk, chunk, axis=1)
      return jax.lax.dynamic_update_slice_in_dim(out, project(h), i * chunk, axis=1)

    out = jnp.zeros(hidden.shape[:2] + (weight.shape[1],), jnp.float32)
    out = loops.fori_loop(0, n, body, constrain(out, ("batch", "length", "vocab")))
    if length % chunk:
      out = out.at[:, n * chunk:].set(project(hidden[:, n * chunk:]))
    return constrain(out, ("batch", "length", "vocab"))
