"""Rotary position embeddings (HF `rotate_half` convention)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from helpsteer_jax.models.config import ModelConfig


def inverse_frequencies(cfg: ModelConfig) -> np.ndarray:
  """Per-pair inverse frequencies, with Llama 3.1 `llama3` scaling if set."""
  dim = cfg.head_dim
  inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
  scaling = cfg.rope_scaling
  if scaling is None:
    return inv_freq.astype(np.float32)
  old_len = scaling.original_max_position_embeddings
  low_wavelen = old_len / scaling.low_freq_factor
  high_wavelen = old_len / scaling.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
  smooth = (old_len / wavelen - scaling.low_freq_factor) / (
      scaling.high_freq_factor - scaling.low_freq_factor)
  smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(positions: jnp.ndarray, cfg: ModelConfig) -> tuple[jnp.ndarray, jnp.ndarray]:
  """cos and sin of shape [batch, length, head_dim] in fp32."""
  inv_freq = jnp.asarray(inverse_frequencies(cfg))
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def rotate_half(x: jnp.ndarray) -> jnp.ndarray:
  """[x1, x2] -> [-x2, x1] on the last axis.

  Written as a reversal of the two halves rather than slices and a
  concatenation: the reversal's gradient is again a reversal that fuses with
  its neighbours, where a concatenation's gradient is two zero-padded copies.
  """
  half = x.shape[-1] // 2
  pairs = x.reshape(*x.shape[:-1], 2, half)
  sign = jnp.array([-1, 1], x.dtype)[:, None]
  return (jnp.flip(pairs, axis=-2) * sign).reshape(x.shape)


def apply_rope(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
  """Rotates x of shape [batch, length, heads, head_dim]."""
  x32 = x.astype(jnp.float32)
  out = x32 * cos[:, :, None, :] + rotate_half(x32) * sin[:, :, None, :]
  return out.astype(x.dtype)
