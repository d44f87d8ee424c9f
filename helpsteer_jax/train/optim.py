"""Learning-rate schedules and the AdamW optimizer (NeMo-Aligner recipes)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from helpsteer_jax.errors import ConfigError

SCHEDULES = ("constant", "cosine")


def learning_rate_schedule(opt: ml_collections.ConfigDict, num_steps: int) -> optax.Schedule:
  """Linear warmup, then `constant` or NeMo's `CosineAnnealing`.

  `cosine` decays from `lr` to `min_lr` over num_steps - warmup - constant
  steps and then holds `min_lr` for the last `constant_steps` steps, as
  NeMo's CosineAnnealing does.
  """
  if opt.schedule not in SCHEDULES:
    raise ConfigError(f"optimizer.schedule={opt.schedule!r}; choose one of {SCHEDULES}")
  lr, min_lr = float(opt.lr), float(opt.min_lr)
  warmup, constant = int(opt.warmup_steps), int(opt.constant_steps)
  decay = num_steps - warmup - constant
  if opt.schedule == "cosine" and decay <= 0:
    raise ConfigError(
        f"cosine schedule: warmup_steps ({warmup}) + constant_steps ({constant}) must be"
        f" fewer than train.num_steps ({num_steps})")

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm = lr * jnp.minimum(1.0, (step + 1) / max(warmup, 1)) if warmup else lr
    if opt.schedule == "constant":
      return jnp.where(step < warmup, warm, lr)
    progress = jnp.clip((step - warmup) / max(decay, 1), 0.0, 1.0)
    cosine = min_lr + 0.5 * (lr - min_lr) * (1 + jnp.cos(jnp.pi * progress))
    return jnp.where(step < warmup, warm, cosine)

  return schedule


def _decay_mask(params: Any) -> Any:
  """Weight decay on matrices only: no decay for norms and biases."""
  def decays(path, _):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    return not ("norm" in name or "bias" in name)
  return jax.tree_util.tree_map_with_path(decays, params)


def apply_if_finite(inner: optax.GradientTransformation,
                    max_consecutive_errors: int) -> optax.GradientTransformationExtraArgs:
  """`optax.apply_if_finite` (same state, same semantics) without a `lax.cond`.

  The inner update always runs and a select keeps the old moments and zero
  updates when the gradient is not finite. XLA cannot fuse across a
  conditional: under `lax.cond` the gradient tree (the cond's operand) and
  the updates tree (its result) are both live, a second fp32 copy of the
  parameters per device. Selects fuse into each leaf's elementwise update.
  """
  inner = optax.with_extra_args_support(inner)

  def init(params):
    return optax.ApplyIfFiniteState(
        notfinite_count=jnp.zeros([], jnp.int32), last_finite=jnp.array(True, jnp.bool_),
        total_notfinite=jnp.zeros([], jnp.int32), inner_state=inner.init(params))

  def update(updates, state, params=None, **extra_args):
    isfinite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(u)) for u in jax.tree.leaves(updates)]))
    notfinite_count = jnp.where(isfinite, jnp.zeros([], jnp.int32),
                                optax.safe_increment(state.notfinite_count))
    keep = jnp.logical_or(isfinite, notfinite_count > max_consecutive_errors)
    new_updates, new_inner = inner.update(updates, state.inner_state, params, **extra_args)
    new_updates = jax.tree.map(lambda u: jnp.where(keep, u, jnp.zeros_like(u)), new_updates)
    new_inner = jax.tree.map(lambda new, old: jnp.where(keep, new, old), new_inner,
                             state.inner_state)
    total = jnp.where(isfinite, state.total_notfinite,
                      optax.safe_increment(state.total_notfinite))
    return new_updates, optax.ApplyIfFiniteState(
        notfinite_count=notfinite_count, last_finite=isfinite, total_notfinite=total,
        inner_state=new_inner)

  return optax.GradientTransformationExtraArgs(init=init, update=update)


def make_optimizer(opt: ml_collections.ConfigDict,
                   num_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Global-norm clipping followed by AdamW (decoupled weight decay).

  The chain is wrapped in `apply_if_finite`: a non-finite gradient
  skips the whole update (params and moments) and is counted in the
  optimizer state; the training loop aborts on a long run of them.
  """
  schedule = learning_rate_schedule(opt, num_steps)
  parts = []
  if opt.grad_clip and opt.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(float(opt.grad_clip)))
  parts.append(optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                           weight_decay=opt.weight_decay, mask=_decay_mask))
  chain = optax.chain(*parts)
  return apply_if_finite(chain, max_consecutive_errors=np.iinfo(np.int32).max), schedule
