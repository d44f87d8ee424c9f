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


def make_optimizer(opt: ml_collections.ConfigDict,
                   num_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Global-norm clipping followed by AdamW (decoupled weight decay).

  The chain is wrapped in `optax.apply_if_finite`: a non-finite gradient
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
  return optax.apply_if_finite(chain, max_consecutive_errors=np.iinfo(np.int32).max), schedule


def optimizer_config(**overrides: Any) -> ml_collections.ConfigDict:
  """The `config.optimizer` section (NeMo-Aligner SFT defaults)."""
  cfg = ml_collections.ConfigDict(dict(
      lr=1e-4, min_lr=1e-5, schedule="cosine", warmup_steps=10, constant_steps=0,
      weight_decay=0.01, b1=0.9, b2=0.98, eps=1e-8, grad_clip=1.0))
  cfg.update(overrides)
  return cfg
