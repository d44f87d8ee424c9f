"""The regression reward model (SteerLM Attribute Prediction Model).

The decoder backbone (any family) without its LM head, plus a linear head (hidden -> 9,
fp32, with or without a bias) in NeMo-Aligner's attribute order (`records.ATTRIBUTES`).
The head reads the final-norm hidden state of the last real token of a
sequence: the last token of `<extra_id_2>` in the regression format.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.models import builder
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.layers import LOGICAL_AXES

NUM_ATTRIBUTES = len(ATTRIBUTES)


class RewardHead(nnx.Module):
  """`hidden @ kernel (+ bias)` in fp32; replicated (it is tiny).

  Without a bias it is transformers' `score` layer of a *ForSequenceClassification model.
  """

  def __init__(self, hidden_size: int, num_outputs: int = NUM_ATTRIBUTES, bias: bool = False):
    self.kernel = nnx.Param(jnp.zeros((hidden_size, num_outputs), jnp.float32),
                            **{LOGICAL_AXES: (None, None)})
    if bias:
      self.bias = nnx.Param(jnp.zeros((num_outputs,), jnp.float32), **{LOGICAL_AXES: (None,)})

  @property
  def has_bias(self) -> bool:
    return hasattr(self, "bias")

  def __call__(self, hidden: jax.Array) -> jax.Array:
    out = jnp.einsum("...d,dk->...k", hidden.astype(jnp.float32), self.kernel[...])
    return out + self.bias[...] if self.has_bias else out


def last_token_index(segment_ids: jax.Array) -> jax.Array:
  """[B] index of the last real (segment id > 0) token of each row.

  Works for right padding (real tokens first) and left padding (real tokens
  last); a row without real tokens gives 0.
  """
  idx = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)
  return jnp.max(jnp.where(segment_ids > 0, idx, 0), axis=1)


class RewardModel(nnx.Module):
  """Backbone (no LM head) + `RewardHead`."""

  trained_with_adapters = ("head",)  # with LoRA on the backbone the head trains whole

  def __init__(self, backbone: nnx.Module, num_outputs: int = NUM_ATTRIBUTES,
               head_bias: bool = False):
    if hasattr(backbone, "lm_head"):
      del backbone.lm_head  # a reward model predicts no tokens
    self.cfg: ModelConfig = backbone.cfg
    self.backbone = backbone
    self.head = RewardHead(backbone.cfg.hidden_size, num_outputs, head_bias)

  def __call__(self, tokens: jax.Array, positions: jax.Array | None = None,
               segment_ids: jax.Array | None = None) -> jax.Array:
    """Per-token head outputs [B, T, num_outputs] (fp32).

    Training reads them where the batch marks the end of each (packed)
    sequence; the head costs 2 x hidden x 9 FLOPs per token, nothing next
    to the backbone.
    """
    return self.head(self.backbone(tokens, positions, segment_ids))

  def score_last(self, tokens: jax.Array, positions: jax.Array,
                 segment_ids: jax.Array) -> jax.Array:
    """[B, num_outputs]: the head at the last real token of each row."""
    hidden = self.backbone(tokens, positions, segment_ids)
    last = last_token_index(segment_ids)
    picked = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
    return self.head(picked)


def reward_model(cfg: ModelConfig, seed: int = 0, head_bias: bool = False) -> RewardModel:
  """A fresh (random backbone, zero head) reward model; used under eval_shape."""
  return RewardModel(builder.new_model(cfg, seed), head_bias=head_bias)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Training FLOPs per token: the decoder's without the LM head, plus the 9-way head."""
  return (cfg.flops_per_token(seq_len) - 6 * cfg.vocab_size * cfg.hidden_size
          + 6 * cfg.hidden_size * NUM_ATTRIBUTES)
