"""The correction for the gap between the sampler's and the trainer's log-probabilities.

The engine that samples rollouts computes each token's log-probability with other
kernels, another batch layout, a KV cache and possibly another dtype (bf16
rollouts of an fp32 update) than the training path, so the policy that sampled,
pi_sampler, is not exactly the policy whose ratio the loss takes, pi_old.
Truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training") weighs each token's loss by
w = pi_old / pi_sampler, capped: TRL 1.9 GRPOTrainer's
`vllm_importance_sampling_mode` / `vllm_importance_sampling_cap`, verl's
`rollout_is`. Arrays are [B, T] over completion tokens with `mask` [B, T].

Modes (granularity x constraint, TRL's names):
- "token_truncate": w_t = min(exp(old_t - sampler_t), cap);
- "token_mask": w_t = exp(old_t - sampler_t), 0 where it exceeds cap;
- "sequence_truncate" / "sequence_mask": one w per completion from the sum of its
  masked token log-ratios, truncated or masked the same way.

The weights are constants of the update (no gradient), multiplying the clipped
surrogate per token before the KL term is added, as TRL does. The mismatch is
logged as the per-token KL(pi_sampler || pi_old), estimated on the sampled tokens
(k1, and k3: exp(d) - d - 1, d = old - sampler).
"""

from __future__ import annotations

import numpy as np

from helpsteer_jax.errors import ConfigError

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def check_mode(mode: str) -> None:
  if mode not in MODES:
    raise ConfigError(f"sampler correction {mode!r}: choose one of {', '.join(MODES)}")


def weights(old_logp: np.ndarray, sampler_logp: np.ndarray, mask: np.ndarray, mode: str,
            cap: float) -> np.ndarray:
  """[B, T] float32 importance weights of the sampled tokens (0 past the mask; a
  sequence mode's one weight per completion on each of its tokens)."""
  check_mode(mode)
  mask = np.asarray(mask, np.float32)
  diff = (np.asarray(old_logp, np.float32) - np.asarray(sampler_logp, np.float32)) * mask
  if mode.startswith("sequence"):
    diff = diff.sum(-1, keepdims=True)
  ratio = np.exp(diff)
  if mode.endswith("truncate"):
    ratio = np.minimum(ratio, np.float32(cap))
  else:
    ratio = np.where(ratio > cap, np.float32(0.0), ratio)
  return (np.broadcast_to(ratio, mask.shape) * mask).astype(np.float32)


def metrics(old_logp: np.ndarray, sampler_logp: np.ndarray, mask: np.ndarray,
            w: np.ndarray | None = None, mode: str = "token_truncate") -> dict[str, float]:
  """The mismatch per token: `mismatch_kl` (k1) and `mismatch_kl_k3` of
  KL(pi_sampler || pi_old) on the sampled tokens, `mismatch_abs_max`; with the
  weights `w`, their min / mean / max (per completion in a sequence mode) and the
  share of them changed by the cap (`is_capped`)."""
  mask = np.asarray(mask, np.float32)
  tokens = max(float(mask.sum()), 1.0)
  d = (np.asarray(old_logp, np.float64) - np.asarray(sampler_logp, np.float64)) * mask
  out = {"mismatch_kl": float(-d.sum() / tokens),
         "mismatch_kl_k3": float(((np.exp(d) - d - 1.0) * mask).sum() / tokens),
         "mismatch_abs_max": float(np.abs(d).max()) if d.size else 0.0}
  if w is None:
    return out
  live = mask.sum(-1) > 0
  if mode.startswith("sequence"):
    values = w[live, :].max(-1) if live.any() else np.zeros(0)
    raw = np.exp(d.sum(-1))[live]
  else:
    values, raw = w[mask > 0], np.exp(d)[mask > 0]
  if values.size:
    out.update(is_weight_min=float(values.min()), is_weight_mean=float(values.mean()),
               is_weight_max=float(values.max()),
               is_capped=float(np.mean(~np.isclose(values, raw, rtol=1e-5, atol=0.0))))
  return out
