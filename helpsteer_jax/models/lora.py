"""LoRA adapters on the decoder's projections, as PEFT defines them.

A targeted projection `y = x W` becomes `y = x W + (alpha / rank) (x A) B`
with `A` [in, rank] initialised uniform in +-1/sqrt(in) (PEFT's
`kaiming_uniform_(a=sqrt(5))`) and `B` [rank, out] zeros, so a fresh
adapter changes nothing. Adapters are `nnx.LoRAParam`s (a kind of
`nnx.Param`) kept in fp32 whatever the base weights' dtype; their logical
axes are those of the weight they adapt, with a replicated `lora_rank` axis
between, so FSDP and tensor sharding split them as they split the weight.

`disabled()` switches every adapter off while a function is traced: the
2D-DPO reference pass is the same model with the adapters off (PEFT's
`disable_adapter()`), so it needs no second copy of the weights.

Dropout on the adapter input (PEFT's `lora_dropout`) applies only where a
training step traces the model inside `dropout_key(key)`; each adapter
draws its mask from that key folded with its layer (`layer_index`, set by
the decoder's layer loop) and its target, so masks differ across layers and
projections and are recomputed identically under rematerialisation.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from helpsteer_jax.errors import ConfigError

# Our target name -> (the block holding the weight, the weight's attribute).
TARGETS: dict[str, tuple[str, str]] = {
    "q": ("attn", "q_proj"), "k": ("attn", "k_proj"), "v": ("attn", "v_proj"),
    "o": ("attn", "o_proj"), "gate": ("mlp", "gate_proj"), "up": ("mlp", "up_proj"),
    "down": ("mlp", "down_proj")}
RANK_AXIS = "lora_rank"
LOGICAL_AXES = "logical_axes"

_ENABLED = contextvars.ContextVar("lora_enabled", default=True)
_DROPOUT_KEY = contextvars.ContextVar("lora_dropout_key", default=None)
_LAYER = contextvars.ContextVar("lora_layer", default=0)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Rank, alpha (scale alpha / rank), targeted projections, dropout on the adapter input."""

  rank: int
  alpha: float
  targets: tuple[str, ...] = tuple(TARGETS)
  dropout: float = 0.0

  def __post_init__(self):
    unknown = [t for t in self.targets if t not in TARGETS]
    if unknown or not self.targets:
      raise ConfigError(f"model.lora.targets={','.join(self.targets)!r}: choose a non-empty"
                        f" subset of {','.join(TARGETS)}")
    if self.rank <= 0:
      raise ConfigError(f"model.lora.rank={self.rank} must be positive (0 turns LoRA off)")
    if not 0.0 <= self.dropout < 1.0:
      raise ConfigError(f"model.lora.dropout={self.dropout} must be in [0, 1)")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def parse_targets(spec: str | tuple[str, ...]) -> tuple[str, ...]:
  """"q,k,v" (or a tuple) -> targets in canonical order; "all" or "" = all seven."""
  names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
  names = [n for n in names if n]
  if not names or names == ["all"]:
    return tuple(TARGETS)
  return tuple(t for t in TARGETS if t in names) + tuple(n for n in names if n not in TARGETS)


def enabled() -> bool:
  return _ENABLED.get()


@contextlib.contextmanager
def _setting(var: contextvars.ContextVar, value) -> Iterator[None]:
  token = var.set(value)
  try:
    yield
  finally:
    var.reset(token)


def disabled():
  """Adapters off for what is traced inside (the base model's outputs, exactly)."""
  return _setting(_ENABLED, False)


def dropout_key(key: jax.Array | None):
  """Adapter dropout on, drawn from `key`, for what is traced inside (a training step)."""
  return _setting(_DROPOUT_KEY, key)


def layer_index(index: jax.Array | int):
  """The (traced) index of the decoder layer being traced."""
  return _setting(_LAYER, index)


class Adapter(nnx.Module):
  """`lora_a` [in..., rank] and `lora_b` [rank, out...] of one projection."""

  def __init__(self, in_shape: tuple[int, ...], in_axes: tuple[str | None, ...],
               out_shape: tuple[int, ...], out_axes: tuple[str | None, ...],
               cfg: LoraConfig, *, rngs: nnx.Rngs, salt: int = 0):
    max_rank = min(math.prod(in_shape), math.prod(out_shape))
    if cfg.rank > max_rank:
      raise ConfigError(f"model.lora.rank={cfg.rank} exceeds a targeted projection's"
                        f" dimensions {in_shape} -> {out_shape}: use a rank <= {max_rank}")
    bound = 1.0 / math.sqrt(math.prod(in_shape))
    a = jax.random.uniform(rngs.params(), in_shape + (cfg.rank,), jnp.float32, -bound, bound)
    self.lora_a = nnx.LoRAParam(a, **{LOGICAL_AXES: tuple(in_axes) + (RANK_AXIS,)})
    self.lora_b = nnx.LoRAParam(jnp.zeros((cfg.rank,) + out_shape, jnp.float32),
                                **{LOGICAL_AXES: (RANK_AXIS,) + tuple(out_axes)})
    self.scale = cfg.scale
    self.in_ndim = len(in_shape)
    self.dropout = cfg.dropout
    self.salt = salt

  def __call__(self, x: jax.Array) -> jax.Array:
    """(alpha / rank) (dropout(x) A) B for x [..., in...] in its own dtype."""
    key = _DROPOUT_KEY.get()
    if self.dropout > 0 and key is not None:
      key = jax.random.fold_in(jax.random.fold_in(key, _LAYER.get()), self.salt)
      keep = jax.random.bernoulli(key, 1.0 - self.dropout, x.shape)
      x = jnp.where(keep, x / (1.0 - self.dropout), 0).astype(x.dtype)
    a, b = self.lora_a[...], self.lora_b[...]
    lead, out_shape = x.shape[:x.ndim - self.in_ndim], b.shape[1:]
    # Two plain 2-D matmuls, the scale folded into B: contracting several
    # axes at once (x's leading axes in dA) is far slower on XLA:CPU.
    a = a.reshape(-1, a.shape[-1]).astype(x.dtype)
    b = (self.scale * b.reshape(b.shape[0], -1)).astype(x.dtype)
    y = (x.reshape(-1, a.shape[0]) @ a) @ b
    return y.reshape(lead + out_shape)

def maybe_adapter(cfg: LoraConfig | None, target: str, in_shape, in_axes, out_shape, out_axes,
                  rngs: nnx.Rngs) -> Adapter | None:
  """The adapter of `target` when LoRA is on and targets it, else None."""
  if cfg is None or target not in cfg.targets:
    return None
  return Adapter(tuple(in_shape), tuple(in_axes), tuple(out_shape), tuple(out_axes), cfg,
                 rngs=rngs, salt=list(TARGETS).index(target))


def add(y: jax.Array, adapter: Adapter | None, x: jax.Array) -> jax.Array:
  """`y` plus the adapter's update of the projection x -> y (when on)."""
  if adapter is None or not enabled():
    return y
  return y + adapter(x)
