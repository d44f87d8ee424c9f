"""Typed configuration of the decoder every model family shares."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models.lora import LoraConfig

REMAT_POLICIES = ("none", "full", "save_dots", "save_dots_no_batch")
ATTENTION_IMPLS = ("xla", "blockwise", "splash", "cudnn")
MLP_ACTIVATIONS = ("silu", "gelu_tanh")
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """The `llama3` RoPE frequency scaling of Llama 3.1 (HF `rope_scaling`)."""

  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shapes, family knobs and numerics of a pre-norm decoder.

  Llama is every family knob off; Mistral, Qwen2, Qwen3 and Gemma 2 turn on
  the few they differ in (`models/families` maps each HF `model_type` to
  its knobs). `dtype` is the compute dtype; parameters are stored in
  `param_dtype` (fp32 master weights with bf16 compute is the usual
  training setup).
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int | None = None
  rms_norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  max_position_embeddings: int = 4096
  tie_word_embeddings: bool = False
  attention_bias: bool = False  # Qwen2: bias on q, k, v (not o)
  qk_norm: bool = False  # Qwen3: RMSNorm of each query / key head before RoPE
  mlp_activation: str = "silu"  # gated MLP: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
  sandwich_norms: bool = False  # Gemma 2: also normalise attention and MLP outputs
  norm_unit_offset: bool = False  # Gemma: RMSNorm scales by (1 + weight)
  scale_embeddings: bool = False  # Gemma: embeddings times sqrt(hidden_size)
  query_pre_attn_scalar: float | None = None  # Gemma 2: scores scaled by its -1/2 power
  attn_logit_softcap: float | None = None  # scores -> c * tanh(scores / c)
  final_logit_softcap: float | None = None  # logits -> c * tanh(logits / c)
  # Keys a query sees on windowed layers, itself included (HF's
  # `kv_idx > q_idx - sliding_window`). `layer_types` ("sliding_attention" /
  # "full_attention") repeats cyclically over the layers; None windows every
  # layer (Mistral) when `sliding_window` is set.
  sliding_window: int | None = None
  layer_types: tuple[str, ...] | None = None
  bos_token_id: int | None = 1
  eos_token_id: int | tuple[int, ...] | None = 2
  pad_token_id: int | None = None
  initializer_range: float = 0.02
  hf_architecture: str = "LlamaForCausalLM"
  hf_model_type: str = "llama"
  # Numerics and performance knobs (not part of the checkpoint).
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat_policy: str = "none"
  scan_layers: bool = True
  attention_impl: str = "xla"
  attention_block_size: int = 128
  logits_chunk_size: int = 256  # sequence chunk of `Llama.logits` (0 = one GEMM)
  lora: LoraConfig | None = None  # adapters on the projections (models/lora.py)

  def __post_init__(self):
    if self.head_dim is None:
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
    if isinstance(self.rope_scaling, Mapping):
      object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
    if isinstance(self.eos_token_id, list):
      object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
    if self.layer_types is not None:
      object.__setattr__(self, "layer_types", tuple(self.layer_types))
    errors = self._family_errors()
    if self.num_heads % self.num_kv_heads:
      errors.append(
          f"num_heads={self.num_heads} is not a multiple of"
          f" num_kv_heads={self.num_kv_heads}")
    if self.remat_policy not in REMAT_POLICIES:
      errors.append(
          f"remat_policy={self.remat_policy!r}; choose one of {REMAT_POLICIES}")
    if self.attention_impl not in ATTENTION_IMPLS:
      errors.append(f"attention_impl={self.attention_impl!r}; choose one of"
                    f" {ATTENTION_IMPLS}")
    if self.attention_impl == "cudnn" and self.dtype not in ("bfloat16", "float16"):
      errors.append(f"attention_impl='cudnn' (flash attention) needs dtype bfloat16 or"
                    f" float16, not {self.dtype!r}")
    if self.attention_impl == "cudnn" and self.attn_logit_softcap is not None:
      errors.append(f"attention_impl='cudnn' cannot soft-cap attention logits"
                    f" (attn_logit_softcap={self.attn_logit_softcap}); use blockwise, xla"
                    " or splash")
    for name in ("dtype", "param_dtype"):
      try:
        jnp.dtype(getattr(self, name))
      except TypeError:
        errors.append(f"{name}={getattr(self, name)!r} is not a dtype")
    if errors:
      raise ConfigError("Invalid model config: " + "; ".join(errors))

  def _family_errors(self) -> list[str]:
    errors = []
    if self.mlp_activation not in MLP_ACTIVATIONS:
      errors.append(f"mlp_activation={self.mlp_activation!r}; choose one of {MLP_ACTIVATIONS}")
    if self.layer_types is not None:
      bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
      if bad or not self.layer_types:
        errors.append(f"layer_types={self.layer_types!r}: use a non-empty sequence of"
                      f" {LAYER_TYPES}")
      if "sliding_attention" in self.layer_types and self.sliding_window is None:
        errors.append("layer_types has sliding_attention layers but sliding_window is"
                      " not set")
    if self.sliding_window is not None and self.sliding_window < 1:
      errors.append(f"sliding_window={self.sliding_window} must be at least 1")
    for name in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar"):
      value = getattr(self, name)
      if value is not None and value <= 0:
        errors.append(f"{name}={value} must be positive (or None)")
    return errors

  @property
  def attention_scale(self) -> float:
    """The factor of q.k: 1/sqrt(query_pre_attn_scalar or head_dim)."""
    return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

  def layer_windows(self) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: full causal attention)."""
    kinds = self.layer_types or ("sliding_attention",)
    return tuple(self.sliding_window if kinds[i % len(kinds)] == "sliding_attention"
                 else None for i in range(self.num_layers))

  def window_pattern(self) -> tuple[int | None, ...]:
    """The shortest run of layer windows that repeats over the layers."""
    windows = self.layer_windows()
    for period in range(1, len(windows) + 1):
      if all(w == windows[i % period] for i, w in enumerate(windows)):
        return windows[:period]
    return windows

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)

  def replace(self, **changes: Any) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    """Analytic parameter count (matches the abstract model exactly)."""
    d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
    q = self.num_heads * self.head_dim
    kv = self.num_kv_heads * self.head_dim
    attn = d * q + 2 * d * kv + q * d
    if self.attention_bias:
      attn += q + 2 * kv
    per_layer = attn + 3 * d * f + self._norm_params_per_layer()
    embed = v * d * (1 if self.tie_word_embeddings else 2)
    return self.num_layers * per_layer + embed + d

  def _norm_params_per_layer(self) -> int:
    d = self.hidden_size
    return (4 if self.sandwich_norms else 2) * d + (2 * self.head_dim if self.qk_norm else 0)

  def flops_per_token(self, seq_len: int) -> float:
    """Training FLOPs per token: 6 x matmul params + causal attention.

    Attention scores and values cost 2 * 2 * T * H * Dh per token forward
    for full attention; causal masking halves the useful part (a sliding
    window shorter than T keeps less), and the backward pass is twice the
    forward (so x3 overall).
    """
    d, v = self.hidden_size, self.vocab_size
    matmul_params = (self.num_params() - v * d - d
                     - self.num_layers * self._norm_params_per_layer())
    if self.tie_word_embeddings:
      matmul_params += v * d  # the tied embedding is still the LM head matmul
    per_layer = 2 * 2 * seq_len * self.num_heads * self.head_dim
    attn = sum(per_layer * _visible_fraction(w, seq_len) for w in self.layer_windows())
    return 6 * matmul_params + 3 * attn


def _visible_fraction(window: int | None, seq_len: int) -> float:
  """Average keys a causal query sees, over `seq_len` (1/2 for full attention)."""
  if window is None or window >= seq_len:
    return 0.5
  return (window * (window + 1) / 2 + (seq_len - window) * window) / seq_len ** 2
