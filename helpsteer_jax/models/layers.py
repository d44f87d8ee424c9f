"""The decoder layer every family shares, as Flax NNX modules.

One layer covers Llama, Mistral, Qwen2, Qwen3 and Gemma 2 through the
`ModelConfig` knobs: QKV bias, q/k norms, the gated MLP's activation,
sandwich norms, (1 + weight) RMSNorm, query scale, attention soft-cap and
a per-layer sliding window (static: the stack groups layers by window).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from helpsteer_jax.models import attention as attention_lib
from helpsteer_jax.models import lora
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.rope import apply_rope
from helpsteer_jax.models.swiglu import apply_activation, gated_mlp
from helpsteer_jax.sharding import constrain

LOGICAL_AXES = "logical_axes"


def param(rngs: nnx.Rngs | None, shape: tuple[int, ...], axes: tuple[str | None, ...],
          cfg: ModelConfig, init: str = "normal") -> nnx.Param:
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


def project(spec: str, x: jax.Array, w: jax.Array) -> jax.Array:
  """`einsum(spec, x, w)` accumulated in fp32 and rounded to x's dtype.

  For bf16 the fp32 accumulation is what accelerators do anyway, and on
  CPUs with AVX512-BF16 it selects XLA's bf16 GEMM kernels; a bf16-output
  dot there takes a conversion path several times slower than fp32.
  """
  return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32).astype(x.dtype)


class RMSNorm(nnx.Module):
  """HF LlamaRMSNorm (normalise in fp32, cast back, then scale), or with
  `norm_unit_offset` Gemma's (scale by 1 + weight in fp32, then cast)."""

  def __init__(self, dim: int, cfg: ModelConfig, axis: str = "embed"):
    self.eps = cfg.rms_norm_eps
    self.unit_offset = cfg.norm_unit_offset
    self.scale = param(None, (dim,), (axis,), cfg, init="zeros" if self.unit_offset else "ones")

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    if self.unit_offset:
      return (x32 * (1.0 + self.scale[...].astype(jnp.float32))).astype(x.dtype)
    return self.scale[...].astype(x.dtype) * x32.astype(x.dtype)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE, optional QKV bias and q/k norms."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, h, k, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.q_proj = param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), cfg)
    self.k_proj = param(rngs, (d, k, hd), ("embed", "kv_heads", "head_dim"), cfg)
    self.v_proj = param(rngs, (d, k, hd), ("embed", "kv_heads", "head_dim"), cfg)
    self.o_proj = param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), cfg)
    lc = cfg.lora
    self.q_lora = lora.maybe_adapter(lc, "q", (d,), ("embed",), (h, hd), ("heads", "head_dim"),
                                     rngs)
    self.k_lora = lora.maybe_adapter(lc, "k", (d,), ("embed",), (k, hd),
                                     ("kv_heads", "head_dim"), rngs)
    self.v_lora = lora.maybe_adapter(lc, "v", (d,), ("embed",), (k, hd),
                                     ("kv_heads", "head_dim"), rngs)
    self.o_lora = lora.maybe_adapter(lc, "o", (h, hd), ("heads", "head_dim"), (d,), ("embed",),
                                     rngs)
    if cfg.attention_bias:
      self.q_bias = param(None, (h, hd), ("heads", "head_dim"), cfg, "zeros")
      self.k_bias = param(None, (k, hd), ("kv_heads", "head_dim"), cfg, "zeros")
      self.v_bias = param(None, (k, hd), ("kv_heads", "head_dim"), cfg, "zeros")
    if cfg.qk_norm:
      self.q_norm = RMSNorm(hd, cfg, axis="head_dim")
      self.k_norm = RMSNorm(hd, cfg, axis="head_dim")

  def project_qkv(self, x: jax.Array, cos: jax.Array, sin: jax.Array):
    dt = self.cfg.compute_dtype
    q = lora.add(project("btd,dhk->bthk", x, _w(self.q_proj, dt)), self.q_lora, x)
    k = lora.add(project("btd,dhk->bthk", x, _w(self.k_proj, dt)), self.k_lora, x)
    v = lora.add(project("btd,dhk->bthk", x, _w(self.v_proj, dt)), self.v_lora, x)
    if self.cfg.attention_bias:
      q = q + _w(self.q_bias, dt)
      k = k + _w(self.k_bias, dt)
      v = v + _w(self.v_bias, dt)
    if self.cfg.qk_norm:
      with jax.named_scope("qk_norm"):
        q, k = self.q_norm(q), self.k_norm(k)
    q = constrain(apply_rope(q, cos, sin), ("batch", "length", "heads", "head_dim"))
    k = constrain(apply_rope(k, cos, sin), ("batch", "length", "kv_heads", "head_dim"))
    v = constrain(v, ("batch", "length", "kv_heads", "head_dim"))
    return q, k, v

  def output(self, attn: jax.Array) -> jax.Array:
    out = project("bthk,hkd->btd", attn, _w(self.o_proj, self.cfg.compute_dtype))
    return lora.add(out, self.o_lora, attn)

  def knobs(self, window: int | None) -> dict:
    return dict(scale=self.cfg.attention_scale, window=window,
                softcap=self.cfg.attn_logit_softcap)

  def attend(self, q, k, v, info, window):
    return attention_lib.attention(q, k, v, info, self.cfg.attention_impl,
                                   self.cfg.attention_block_size, **self.knobs(window))

  def __call__(self, x, cos, sin, info: attention_lib.MaskInfo,
               window: int | None = None) -> jax.Array:
    return self.output(self.attend(*self.project_qkv(x, cos, sin), info, window))


class MLP(nnx.Module):
  """Gated feed-forward: down(act(gate(x)) * up(x)), act = SiLU or tanh-GELU."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, f = cfg.hidden_size, cfg.intermediate_size
    self.gate_proj = param(rngs, (d, f), ("embed", "mlp"), cfg)
    self.up_proj = param(rngs, (d, f), ("embed", "mlp"), cfg)
    self.down_proj = param(rngs, (f, d), ("mlp", "embed"), cfg)
    lc = cfg.lora
    self.gate_lora = lora.maybe_adapter(lc, "gate", (d,), ("embed",), (f,), ("mlp",), rngs)
    self.up_lora = lora.maybe_adapter(lc, "up", (d,), ("embed",), (f,), ("mlp",), rngs)
    self.down_lora = lora.maybe_adapter(lc, "down", (f,), ("mlp",), (d,), ("embed",), rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    dt = self.cfg.compute_dtype
    w_gate, w_up, w_down = _w(self.gate_proj, dt), _w(self.up_proj, dt), _w(self.down_proj, dt)
    adapters = (self.gate_lora, self.up_lora, self.down_lora)
    if not lora.enabled() or all(a is None for a in adapters):
      return gated_mlp(x, w_gate, w_up, w_down, self.cfg.mlp_activation)
    # With adapters, autodiff: the frozen weights' gradients are never formed.
    gate = lora.add(x @ w_gate, self.gate_lora, x)
    up = lora.add(x @ w_up, self.up_lora, x)
    hidden = apply_activation(gate, self.cfg.mlp_activation) * up
    hidden = constrain(hidden, ("batch", "length", "mlp"))
    return lora.add(hidden @ w_down, self.down_lora, hidden)


class DecoderLayer(nnx.Module):
  """Pre-norm attention and MLP blocks with residuals.

  `post_attention_norm` is the norm before the MLP (HF Llama's name); with
  `sandwich_norms` the attention and MLP outputs are also normalised
  (`attn_output_norm`, `mlp_output_norm`) before their residual adds.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.input_norm = RMSNorm(cfg.hidden_size, cfg)
    self.attn = Attention(cfg, rngs=rngs)
    self.post_attention_norm = RMSNorm(cfg.hidden_size, cfg)
    self.mlp = MLP(cfg, rngs=rngs)
    if cfg.sandwich_norms:
      self.attn_output_norm = RMSNorm(cfg.hidden_size, cfg)
      self.mlp_output_norm = RMSNorm(cfg.hidden_size, cfg)

  def __call__(self, x, cos, sin, info, window: int | None = None) -> jax.Array:
    with jax.named_scope("input_norm"):
      h = self.input_norm(x)
    with jax.named_scope("attention"):
      h = self.attn(h, cos, sin, info, window)
    return self.add_mlp(x, h)

  def add_mlp(self, x: jax.Array, attn_out: jax.Array) -> jax.Array:
    if self.cfg.sandwich_norms:
      with jax.named_scope("attn_output_norm"):
        attn_out = self.attn_output_norm(attn_out)
    x = x + attn_out
    with jax.named_scope("post_attention_norm"):
      h = self.post_attention_norm(x)
    with jax.named_scope("mlp"):
      h = self.mlp(h)
    if self.cfg.sandwich_norms:
      with jax.named_scope("mlp_output_norm"):
        h = self.mlp_output_norm(h)
    return constrain(x + h, ("batch", "length", "embed"))
