"""Gated feed-forward (SwiGLU, GeGLU) with a hand-written backward pass.

    y = (act(x @ W_gate) * (x @ W_up)) @ W_down,  act = silu or tanh-gelu

Autodiff of this expression gives the right numbers but a poor program on
XLA:CPU: the SiLU derivative is fused into a transposing copy of the
[tokens, mlp] gradient so the weight-gradient dots can contract over tokens,
and that strided copy costs about as much as a matmul (it was ~10% of the
100M-model train step). The backward below computes the same gradients from
the same residuals (the two input projections, which `dots_saveable` remat
policies keep, and the layer input) with plain 2-D GEMMs: one [mlp, tokens]
operand fewer to transpose and the SiLU derivative fused into the
elementwise producers of those GEMMs. On accelerators it is the same dots.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from helpsteer_jax.sharding import constrain

_HIDDEN_AXES = ("batch", "length", "mlp")


_GELU_C = math.sqrt(2 / math.pi)


def apply_activation(gate: jax.Array, activation: str) -> jax.Array:
  """act(gate): SiLU or HF's gelu_pytorch_tanh."""
  if activation == "silu":
    return jax.nn.silu(gate)
  return jax.nn.gelu(gate, approximate=True)  # HF's gelu_pytorch_tanh


def _act_grad(g32: jax.Array, activation: str) -> jax.Array:
  """act'(g) in fp32."""
  if activation == "silu":
    sig = jax.nn.sigmoid(g32)  # silu'(g) = s * (1 + g * (1 - s))
    return sig * (1.0 + g32 * (1.0 - sig))
  t = jnp.tanh(_GELU_C * (g32 + 0.044715 * g32 ** 3))
  return 0.5 * (1.0 + t) + 0.5 * g32 * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * g32 ** 2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def gated_mlp(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array,
              activation: str = "silu") -> jax.Array:
  """Gated MLP on x [..., embed] with weights [embed, mlp], [embed, mlp], [mlp, embed]."""
  return _forward(x, w_gate, w_up, w_down, activation)[0]


def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
  return gated_mlp(x, w_gate, w_up, w_down, "silu")


def _matmul(x: jax.Array, w: jax.Array) -> jax.Array:
  """x @ w accumulated in fp32, in x's dtype (see `layers.project`)."""
  return jnp.matmul(x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def _forward(x, w_gate, w_up, w_down, activation):
  gate = _matmul(x, w_gate)
  up = _matmul(x, w_up)
  hidden = constrain(apply_activation(gate, activation) * up, _HIDDEN_AXES)
  return _matmul(hidden, w_down), (x, gate, up, w_gate, w_up, w_down)


def _backward(activation, residuals, dy):
  x, gate, up, w_gate, w_up, w_down = residuals
  lead = x.shape[:-1]
  x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
  gate2, up2 = gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1])
  act = apply_activation(gate2, activation)  # as in the forward
  g32 = gate2.astype(jnp.float32)
  d_hidden = dy2 @ w_down.T
  d_hidden = constrain(d_hidden.reshape(lead + d_hidden.shape[-1:]), _HIDDEN_AXES)
  d_hidden = d_hidden.reshape(-1, d_hidden.shape[-1])
  d_up = d_hidden * act
  d_gate = (d_hidden.astype(jnp.float32) * up2.astype(jnp.float32)
            * _act_grad(g32, activation)).astype(gate.dtype)
  d_w_down = (act * up2).T @ dy2
  x_t = x2.T
  d_w_gate = x_t @ d_gate
  d_w_up = x_t @ d_up
  dx = d_gate @ w_gate.T + d_up @ w_up.T
  return (dx.reshape(x.shape), d_w_gate.astype(w_gate.dtype), d_w_up.astype(w_up.dtype),
          d_w_down.astype(w_down.dtype))


gated_mlp.defvjp(_forward, _backward)
