"""Per-token policy-gradient losses of online RL, as TRL's GRPOTrainer and PPOTrainer
define them.

Arrays are [B, T] over completion tokens: `logp` under the policy being
trained, `old_logp` under the policy that sampled (equal to `logp`, without
gradient, on the first update of a rollout batch), `ref_logp` under the
reference; `mask` [B, T] is 1 up to and including the stop token.

- Clipped surrogate (PPO; GRPO's per-token form, DAPO's asymmetric
  eps_low / eps_high): -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A),
  rho = exp(log w), the importance weight at a level (TRL 1.9 GRPOTrainer's
  `importance_sampling_level`): "token", log w = logp - old_logp; "sequence"
  (GSPO, Zheng et al. 2025), one weight per completion, the masked mean of the
  token log-ratios; "sequence_token" (GSPO-token, TRL's experimental
  gspo_token trainer), the sequence weight's value with each token's own
  gradient, log w_t - sg(log w_t) + sg(sequence mean); "sequence_sum" (TRL
  1.9 RLOOTrainer), one weight per completion, the sum of the token
  log-ratios.
- k3 KL estimator to the reference (Schulman's; TRL's `per_token_kl`):
  exp(ref - logp) - (ref - logp) - 1, added as beta * KL per token.
- Aggregation (TRL's `loss_type`): "sequence" (mean over each completion's
  tokens, then over completions; GRPO), "token" (over all tokens of the batch;
  TRL's "bnpo"), "dr_grpo" (sum over B * max_tokens, Dr. GRPO's constant).
- PPO's clipped value loss: 0.5 * mean max((V - R)^2, (clip(V, V_old +- c) - R)^2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from helpsteer_jax.errors import ConfigError

AGGREGATIONS = ("sequence", "token", "dr_grpo")
IMPORTANCE_LEVELS = ("token", "sequence", "sequence_token", "sequence_sum")


def k3_kl(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """[B, T] per-token KL estimate to the reference (non-negative)."""
  d = ref_logp - logp
  return jnp.exp(d) - d - 1.0


def log_importance_weights(logp: jax.Array, old_logp: jax.Array, mask: jax.Array,
                           level: str = "token") -> jax.Array:
  """Log importance weights at `level` (see IMPORTANCE_LEVELS): [B, T] for "token" and
  "sequence_token", [B, 1] (one per completion) for "sequence" and "sequence_sum"."""
  log_ratio = logp - old_logp
  if level == "token":
    return log_ratio
  if level not in IMPORTANCE_LEVELS:
    raise ConfigError(f"importance level {level!r}: choose one of"
                      f" {', '.join(IMPORTANCE_LEVELS)}")
  summed = (log_ratio * mask).sum(-1, keepdims=True)
  if level == "sequence_sum":
    return summed
  seq = summed / jnp.maximum(mask.sum(-1, keepdims=True), 1.0)
  if level == "sequence":
    return seq
  return log_ratio - jax.lax.stop_gradient(log_ratio) + jax.lax.stop_gradient(seq)


def clipped_objective(log_w: jax.Array, advantages: jax.Array, eps_low: float,
                      eps_high: float) -> jax.Array:
  """[B, T] (or [B, 1]) loss -min(rho A, clip(rho) A), rho = exp(`log_w`) [B, T] or
  [B, 1]; `advantages` [B] (one per completion) or [B, T] (per token)."""
  adv = advantages[:, None] if advantages.ndim == 1 else advantages
  ratio = jnp.exp(log_w)
  return -jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)


def aggregate_sum(per_token: jax.Array, mask: jax.Array, kind: str,
                  max_tokens: int | None = None) -> tuple[jax.Array, jax.Array]:
  """(summed loss, its normaliser) of [B, T] per-token losses (see AGGREGATIONS): the
  batch loss is their ratio, and sums over micro-batches give the whole batch's."""
  masked = per_token * mask
  if kind == "sequence":
    return (masked.sum(-1) / jnp.maximum(mask.sum(-1), 1.0)).sum(), jnp.float32(mask.shape[0])
  if kind == "token":
    return masked.sum(), mask.sum()
  if kind == "dr_grpo":
    if not max_tokens:
      raise ConfigError("the dr_grpo aggregation divides by max_new_tokens: give it")
    return masked.sum() / max_tokens, jnp.float32(mask.shape[0])
  raise ConfigError(f"loss aggregation {kind!r}: choose one of {', '.join(AGGREGATIONS)}")


def aggregate(per_token: jax.Array, mask: jax.Array, kind: str,
              max_tokens: int | None = None) -> jax.Array:
  """The batch loss from [B, T] per-token losses (see AGGREGATIONS)."""
  total, weight = aggregate_sum(per_token, mask, kind, max_tokens)
  return total / jnp.maximum(weight, 1.0)


def policy_loss_sums(logp: jax.Array, old_logp: jax.Array, ref_logp: jax.Array | None,
                     advantages: jax.Array, mask: jax.Array, *, beta: float, eps_low: float,
                     eps_high: float, aggregation: str, max_tokens: int | None = None,
                     importance_level: str = "token", sampler_weights: jax.Array | None = None
                     ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
  """`policy_loss` as sums, for accumulation over micro-batches: (summed loss, its
  normaliser, token sums: `tokens`, `clipped` (tokens whose ratio, or whose
  completion's, was clipped) and, with a reference, `kl`). `sampler_weights` [B, T]:
  the sampler correction's constant weights (`losses.sampler_correction`), multiplying
  the clipped surrogate per token before the KL term, as TRL's GRPOTrainer does."""
  log_w = log_importance_weights(logp, old_logp, mask, importance_level)
  per_token = jnp.broadcast_to(clipped_objective(log_w, advantages, eps_low, eps_high),
                               logp.shape)
  if sampler_weights is not None:
    per_token = per_token * jax.lax.stop_gradient(sampler_weights)
  sums = {"tokens": mask.sum()}
  if ref_logp is not None and beta:
    kl = k3_kl(logp, ref_logp)
    per_token = per_token + beta * kl
    sums["kl"] = (kl * mask).sum()
  adv = advantages[:, None] if advantages.ndim == 1 else advantages
  ratio = jnp.exp(log_w)
  clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
  sums["clipped"] = (jnp.broadcast_to(clipped, logp.shape) * mask).sum()
  total, weight = aggregate_sum(per_token, mask, aggregation, max_tokens)
  return total, weight, sums


def policy_loss(logp: jax.Array, old_logp: jax.Array, ref_logp: jax.Array | None,
                advantages: jax.Array, mask: jax.Array, *, beta: float, eps_low: float,
                eps_high: float, aggregation: str, max_tokens: int | None = None,
                importance_level: str = "token") -> tuple[jax.Array, dict[str, jax.Array]]:
  """The clipped policy loss with `beta` times the k3 KL per token, aggregated; and its
  metrics: the mean KL and the fraction of tokens whose ratio was clipped (masked means)."""
  total, weight, sums = policy_loss_sums(
      logp, old_logp, ref_logp, advantages, mask, beta=beta, eps_low=eps_low,
      eps_high=eps_high, aggregation=aggregation, max_tokens=max_tokens,
      importance_level=importance_level)
  tokens = jnp.maximum(sums["tokens"], 1.0)
  metrics = {"clip_fraction": sums["clipped"] / tokens}
  if "kl" in sums:
    metrics["kl"] = sums["kl"] / tokens
  return total / jnp.maximum(weight, 1.0), metrics


def value_loss_sum(values: jax.Array, old_values: jax.Array, returns: jax.Array,
                   mask: jax.Array, clip: float) -> jax.Array:
  """`value_loss` before its division by the number of tokens."""
  clipped = jnp.clip(values, old_values - clip, old_values + clip)
  worst = jnp.maximum((values - returns) ** 2, (clipped - returns) ** 2)
  return 0.5 * (worst * mask).sum()


def value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array,
               mask: jax.Array, clip: float) -> jax.Array:
  """PPO's clipped value loss (TRL PPOTrainer's `vf_loss`), a masked mean over tokens."""
  return value_loss_sum(values, old_values, returns, mask, clip) / jnp.maximum(mask.sum(), 1.0)
