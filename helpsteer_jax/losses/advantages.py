"""Advantages of sampled completions for online RL, as TRL and NeMo-RL compute them.

Rewards are one per completion, [P * K] with the K samples of a prompt
adjacent (prompt-major); per-token arrays are [B, T] over completion tokens
with `mask` [B, T] (1 up to and including the stop token).

- RLOO / REINFORCE with a leave-one-out baseline (TRL RLOOTrainer, NeMo-RL
  REINFORCE with `use_leave_one_out_baseline`): A_i = r_i - mean_{j != i} r_j.
- GRPO (TRL GRPOTrainer): A_i = (r_i - mean_g r) / (std_g r + eps), std with
  Bessel's correction as torch's default; `scale=False` is Dr. GRPO's
  unscaled form.
- A group whose rewards are all equal gets exactly 0 in every form, whatever K:
  the rewards are centred first and such a group's advantages set to 0, since
  a float mean of equal values need not equal them (TRL leaves the rounding,
  which the 1e-4 eps then scales up).
- The sequence-level KL penalty folded into the reward (TRL RLOO's
  `rlhf_reward`): r - kl_coef * sum_t (log pi - log ref).
- DAPO's overlong reward shaping (Yu et al. 2025, Eq. 13; verl's DAPO reward
  manager): 0 up to L_max - L_cache tokens, then falling linearly to -factor at
  L_max.
- GAE (Schulman et al. 2016; the backward recursion of TRL's PPOTrainer) for
  PPO's per-token rewards (the KL to the reference at every token, the score
  at the last), the value after a completion's last token 0, and the
  advantages whitened over the batch's tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from helpsteer_jax.errors import ConfigError


def groups(rewards: jax.Array, k: int) -> jax.Array:
  """[P * K] -> [P, K]; K >= 2, since a group of one has no baseline."""
  if k < 2:
    raise ConfigError(f"samples_per_prompt={k}: RLOO and GRPO compare each completion with"
                      " the other samples of its prompt, so they need at least 2")
  if rewards.shape[0] % k:
    raise ConfigError(f"{rewards.shape[0]} rewards do not split into groups of {k}")
  return rewards.reshape(-1, k)


def _zero_if_equal(adv: jax.Array, r: jax.Array) -> jax.Array:
  """[P, K] advantages with every group whose K rewards are equal set to exactly 0.

  The spread max - min of equal floats is exactly 0 (their mean need not be), so
  the test is exact and every group with unequal rewards keeps the published value.
  """
  spread = r.max(axis=1, keepdims=True) - r.min(axis=1, keepdims=True)
  return jnp.where(spread > 0, adv, jnp.zeros_like(adv))


def rloo_advantages(rewards: jax.Array, k: int, normalize: bool = False,
                    eps: float = 1e-8) -> jax.Array:
  """[P * K] leave-one-out advantages (0 for a group of equal rewards); `normalize`: then
  whitened over the batch, (A - mean) / (std + `eps`), std with Bessel's correction
  (TRL's `normalize_advantages`; TRL 1.9's eps is 1e-4)."""
  r = groups(rewards, k)
  baseline = (r.sum(axis=1, keepdims=True) - r) / (k - 1)
  adv = _zero_if_equal(r - baseline, r).reshape(-1)
  if normalize:
    adv = (adv - adv.mean()) / (jnp.std(adv, ddof=1) + eps)
  return adv


def grpo_advantages(rewards: jax.Array, k: int, scale: bool = True,
                    eps: float = 1e-4) -> jax.Array:
  """[P * K] group-relative advantages: reward minus the group mean, over the group's std
  plus `eps` when `scale`; exactly 0 for a group whose rewards are all equal."""
  r = groups(rewards, k)
  adv = r - r.mean(axis=1, keepdims=True)
  if scale:
    adv = adv / (jnp.std(r, axis=1, ddof=1, keepdims=True) + eps)
  return _zero_if_equal(adv, r).reshape(-1)


def with_kl_penalty(scores: jax.Array, logp: jax.Array, ref_logp: jax.Array, mask: jax.Array,
                    kl_coef: float) -> jax.Array:
  """[B] scores minus `kl_coef` times each completion's summed log-ratio to the
  reference (TRL RLOO's sequence-level KL in the reward)."""
  return scores - kl_coef * ((logp - ref_logp) * mask).sum(axis=-1)


def truncation_penalty(scores: jax.Array, finished: jax.Array, penalty: float) -> jax.Array:
  """[B] scores less `penalty` for completions that ran out of tokens before a stop (TRL's
  `missing_eos_penalty`); `finished` [B] is true where a stop ended the completion."""
  return jnp.where(finished, scores, scores - penalty)


def overlong_penalty(lengths: np.ndarray, max_len: int, buffer: int,
                     factor: float = 1.0) -> np.ndarray:
  """[B] float32 penalties (<= 0) of completions of `lengths` tokens: -factor * (length -
  (max_len - buffer)) / buffer past max_len - buffer, else 0 (verl's
  min(-exceed / buffer * factor, 0); DAPO's Eq. 13 for lengths up to max_len)."""
  exceed = np.asarray(lengths, np.float64) - (max_len - buffer)
  return np.minimum(-exceed / buffer * factor, 0.0).astype(np.float32)


def gae(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float,
        lam: float) -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimates and returns, [B, T] each, from per-token rewards and
  value predictions; positions past the mask count as terminal (value 0). The masked
  tokens of a row are its steps in order: where the mask has gaps (a multi-turn row's user
  turns), the last token of one answer bootstraps from the first of the next."""
  # Stable sort: the masked positions first, in order (the identity for a contiguous mask).
  order = jnp.argsort(1 - mask, axis=1, stable=True)
  take = functools.partial(jnp.take_along_axis, indices=order, axis=1)
  rewards, values, mask = take(rewards), take(values) * take(mask), take(mask)
  next_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], axis=1)
  deltas = (rewards + gamma * next_values - values) * mask

  def back(carry, delta):
    adv = delta + gamma * lam * carry
    return adv, adv

  _, adv = jax.lax.scan(back, jnp.zeros(rewards.shape[:1], rewards.dtype), deltas.T,
                        reverse=True)
  adv = adv.T * mask
  rows = jnp.arange(mask.shape[0])[:, None]
  put = lambda x: jnp.zeros_like(x).at[rows, order].set(x)  # noqa: E731 - back in place
  return put(adv), put((adv + values) * mask)


def token_rewards(scores: jax.Array, logp: jax.Array, ref_logp: jax.Array, mask: jax.Array,
                  kl_coef: float) -> jax.Array:
  """[B, T] PPO rewards (TRL PPOTrainer's): -kl_coef * (log pi - log ref) at every
  completion token, plus the completion's score at its last (masked) token."""
  per_token = -kl_coef * (logp - ref_logp) * mask
  t = mask.shape[1]
  last = jnp.where(mask.any(axis=1), t - 1 - jnp.argmax(mask[:, ::-1] > 0, axis=1), 0)
  return per_token + jax.nn.one_hot(last, mask.shape[1], dtype=per_token.dtype) * scores[:, None]


def whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
  """`x` standardised over the masked entries, 0 elsewhere (TRL's `masked_whiten` with its
  unbiased variance, then masked as TRL's PPOTrainer masks advantages)."""
  n = mask.sum()
  mean = (x * mask).sum() / n
  var = (((x - mean) * mask) ** 2).sum() / n * (n / (n - 1))
  return (x - mean) * jax.lax.rsqrt(var + eps) * mask
