"""The decoder-only transformer every model family builds (Flax NNX).

Layer parameters are stacked on a leading `layers` axis and the forward pass
scans over them (one traced layer, so 80-layer models compile in seconds).
Layers whose attention differs (Gemma 2 alternates a sliding window with
full attention) are scanned in groups of one period of the pattern: each
position in the group has its window as a static value, so the blockwise
kernel skips the key blocks left of the window and splash builds a static
`LocalMask`; a window fed through the scan as a traced value would force
every kernel to mask the whole causal triangle. The program is still one
group body, whatever the depth. The forward returns the final-norm hidden
states; `Decoder.logits` projects them to the vocabulary separately so
losses can fuse that projection.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from helpsteer_jax import unrollable
from helpsteer_jax.models import attention as attention_lib
from helpsteer_jax.models import lora
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.layers import LOGICAL_AXES, DecoderLayer, RMSNorm, param
from helpsteer_jax.models.rope import rope_tables
from helpsteer_jax.sharding import constrain


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


class Decoder(nnx.Module):
  """Embeddings, scanned layers, final norm, head (tied or not)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), cfg)

    @nnx.split_rngs(splits=cfg.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_layers(layer_rngs: nnx.Rngs) -> DecoderLayer:
      return DecoderLayer(cfg, rngs=layer_rngs)

    self.layers = make_layers(rngs)
    _prepend_layer_axis(self.layers)
    self.final_norm = RMSNorm(cfg.hidden_size, cfg)
    if not cfg.tie_word_embeddings:
      self.lm_head = param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), cfg)

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

    def step(x, layer, index, window):
      with lora.layer_index(index):  # LoRA dropout draws a mask per layer
        return layer(x, cos, sin, info, window)

    x = self.over_layers(step, self.embed_tokens(tokens), remat=True)
    with jax.named_scope("final_norm"):
      return self.final_norm(x)

  def embed_tokens(self, tokens: jax.Array) -> jax.Array:
    with jax.named_scope("embed"):
      # The table keeps its sharding: SPMD gathers every row's tokens, looks up
      # each device's embed slice and all-to-alls to batch shards, so the
      # backward scatter-adds into the local shard. Gathering the table instead
      # makes its gradient a full fp32 [vocab, embed] scatter on every device.
      x = jnp.take(self.embed[...], tokens, axis=0).astype(self.cfg.compute_dtype)
      if self.cfg.scale_embeddings:  # Gemma: the factor rounded to the compute dtype
        x = x * jnp.asarray(math.sqrt(self.cfg.hidden_size), self.cfg.compute_dtype)
      return constrain(x, ("batch", "length", "embed"))

  def over_layers(self, step: Callable, carry, remat: bool = False):
    """`carry = step(carry, layer, index, window)` over the stacked layers.

    Scans groups of one window period (see the module docstring); a
    remainder of fewer layers than a period runs unrolled after the scan.
    With `remat`, each layer is checkpointed on its own.
    """
    cfg = self.cfg
    graphdef, state = nnx.split(self.layers)
    windows = cfg.window_pattern()
    period, n_layers = len(windows), cfg.num_layers

    def layer_call(window):
      def call(carry, layer_state, index):
        return step(carry, nnx.merge(graphdef, layer_state), index, window)
      if remat and cfg.remat_policy != "none":
        # A scanned body needs no CSE barrier, but the layers unrolled for cost
        # analysis do: without one XLA merges the recomputed forward into the
        # first and the analysis misses the remat FLOPs the real step runs.
        call = jax.checkpoint(call, policy=_remat_policy(cfg.remat_policy),
                              prevent_cse=not cfg.scan_layers or unrollable.unrolling())
      return call

    calls = [layer_call(w) for w in windows]

    def group(carry, xs):
      group_state, first = xs
      for j, call in enumerate(calls):
        layer_state = group_state if period == 1 else jax.tree.map(lambda a: a[j], group_state)
        with jax.named_scope("decoder_layer"):
          carry = call(carry, layer_state, first + j)
      return carry, None

    done = 0
    if cfg.scan_layers and n_layers >= period:
      groups = n_layers // period
      done = groups * period
      grouped = state if period == 1 else jax.tree.map(
          lambda a: a[:done].reshape((groups, period) + a.shape[1:]), state)
      firsts = jnp.arange(groups, dtype=jnp.int32) * period
      carry, _ = unrollable.scan(group, carry, (grouped, firsts))
    for i in range(done, n_layers):
      with jax.named_scope("decoder_layer"):
        carry = calls[i % period](carry, jax.tree.map(lambda a, i=i: a[i], state), i)
    return carry

  # -- the LM head -----------------------------------------------------------------

  def head_weight(self) -> jax.Array:
    """The [hidden, vocab] output projection in compute dtype (for fused losses).

    Losses that project with it apply `cfg.final_logit_softcap` themselves.
    """
    if self.cfg.tie_word_embeddings:
      return self.embed[...].astype(self.cfg.compute_dtype).T
    return self.lm_head[...].astype(self.cfg.compute_dtype)

  def logits(self, hidden: jax.Array) -> jax.Array:
    """Full-vocabulary logits in fp32 (soft-capped if the family does): [B, T, vocab].

    Computed over sequence chunks written into the output in place: the same
    FLOPs, but XLA keeps each chunk's matmul a plain GEMM instead of fusing
    the final norm into one huge kernel (15-20% faster on CPU).
    """
    with jax.named_scope("lm_head"):
      return self._logits(hidden)

  def _logits(self, hidden: jax.Array) -> jax.Array:
    weight = self.head_weight()
    chunk = self.cfg.logits_chunk_size
    length = hidden.shape[1]
    cap = self.cfg.final_logit_softcap

    def project(h):
      out = jnp.einsum("btd,dv->btv", h, weight, preferred_element_type=jnp.float32)
      return out if cap is None else cap * jnp.tanh(out / cap)

    if chunk <= 0 or length <= chunk:
      return constrain(project(hidden), ("batch", "length", "vocab"))
    n = length // chunk

    def body(i, out):
      h = jax.lax.dynamic_slice_in_dim(hidden, i * chunk, chunk, axis=1)
      return jax.lax.dynamic_update_slice_in_dim(out, project(h), i * chunk, axis=1)

    out = jnp.zeros(hidden.shape[:2] + (weight.shape[1],), jnp.float32)
    out = unrollable.fori_loop(0, n, body, constrain(out, ("batch", "length", "vocab")))
    if length % chunk:
      out = out.at[:, n * chunk:].set(project(hidden[:, n * chunk:]))
    return constrain(out, ("batch", "length", "vocab"))
