"""Online-RL advantages and losses against TRL's and NeMo-RL's formulas, re-derived here in
NumPy (float64 loops written as the references write them; compared in fp32 to 1e-5).

References: TRL GRPOTrainer `_compute_loss` (advantages with torch's unbiased std and
eps 1e-4, the clipped per-token objective with eps_low / eps_high, k3 KL, loss types
grpo / bnpo / dr_grpo; TRL 1.9's `importance_sampling_level` "sequence", GSPO, and
the experimental gspo_token trainer's "sequence_token"), TRL RLOOTrainer (leave-one-out
baseline, `rlhf_reward` with a sequence-level KL, `normalize_advantages`,
`missing_eos_penalty`, TRL 1.9's summed sequence ratio), TRL PPOTrainer (the
backward GAE recursion, `vf_loss`), NeMo-RL REINFORCE with a leave-one-out baseline.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.losses import advantages as adv_lib
from helpsteer_jax.losses import policy_gradient as pg

P, K, T = 3, 4, 7
TOL = dict(rtol=1e-5, atol=1e-5)


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  b = P * K
  logp = -rng.uniform(0.1, 3.0, (b, T))
  old = logp + rng.normal(0, 0.3, (b, T))  # ratios on both sides of the clip range
  ref = logp + rng.normal(0, 0.5, (b, T))
  lengths = rng.integers(1, T + 1, b)
  lengths[0] = T  # one completion that ran to the token limit
  mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float64)
  rewards = rng.normal(0, 1, b)
  rewards[K:2 * K] = 0.7  # a group whose rewards are all equal
  return logp, old, ref, mask, rewards


def _f32(*xs):
  return [jnp.asarray(x, jnp.float32) for x in xs]


def _np_rloo(rewards, k):
  out = np.empty_like(rewards)
  for start in range(0, len(rewards), k):
    group = rewards[start:start + k]
    for i in range(k):
      others = [group[j] for j in range(k) if j != i]
      out[start + i] = group[i] - sum(others) / (k - 1)
  return out


def _np_grpo(rewards, k, scale=True):
  out = np.empty_like(rewards)
  for start in range(0, len(rewards), k):
    group = rewards[start:start + k]
    mean = sum(group) / k
    std = np.sqrt(sum((g - mean) ** 2 for g in group) / (k - 1))  # torch.std: unbiased
    out[start:start + k] = (group - mean) / (std + 1e-4) if scale else group - mean
  return out


def test_rloo_and_grpo_advantages():
  *_, rewards = _batch()
  (r,) = _f32(rewards)
  np.testing.assert_allclose(adv_lib.rloo_advantages(r, K), _np_rloo(rewards, K), **TOL)
  want = _np_rloo(rewards, K)
  want = (want - want.mean()) / (want.std(ddof=1) + 1e-8)
  np.testing.assert_allclose(adv_lib.rloo_advantages(r, K, normalize=True), want, **TOL)
  np.testing.assert_allclose(adv_lib.grpo_advantages(r, K), _np_grpo(rewards, K), **TOL)
  np.testing.assert_allclose(adv_lib.grpo_advantages(r, K, scale=False),
                             _np_grpo(rewards, K, scale=False), **TOL)
  # The group of equal rewards: no signal, not a division by zero.
  for a in (adv_lib.rloo_advantages(r, K), adv_lib.grpo_advantages(r, K)):
    np.testing.assert_array_equal(np.asarray(a)[K:2 * K], 0.0)
  # RLOO's advantage is K / (K - 1) times the group-mean-centred reward.
  np.testing.assert_allclose(adv_lib.rloo_advantages(r, K),
                             K / (K - 1) * adv_lib.grpo_advantages(r, K, scale=False), **TOL)


@pytest.mark.parametrize("k", [4, 8, 16])
def test_a_group_of_equal_rewards_gets_exactly_zero(k):
  """Centred first, so equal fp32 rewards give 0 bit for bit for every K (0.1 is not
  a float sum's fixed point: a mean of 8 or 16 of them is off by an ulp); the groups
  with unequal rewards keep TRL's (r - mean) / (std + 1e-4) and the leave-one-out form."""
  rng = np.random.default_rng(k)
  rewards = rng.normal(0, 1, 3 * k).astype(np.float32)
  rewards[k:2 * k] = np.float32(0.1)
  (r,) = _f32(rewards)
  r64 = rewards.astype(np.float64)
  for adv in (adv_lib.grpo_advantages(r, k), adv_lib.grpo_advantages(r, k, scale=False),
              adv_lib.rloo_advantages(r, k)):
    assert (np.asarray(adv)[k:2 * k] == 0).all()
  rest = np.r_[0:k, 2 * k:3 * k]
  np.testing.assert_allclose(np.asarray(adv_lib.grpo_advantages(r, k))[rest],
                             _np_grpo(r64, k)[rest], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(adv_lib.grpo_advantages(r, k, scale=False))[rest],
                             _np_grpo(r64, k, scale=False)[rest], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(adv_lib.rloo_advantages(r, k))[rest],
                             _np_rloo(r64, k)[rest], rtol=1e-6, atol=1e-6)
  # Whitening a batch whose groups are all equal keeps the zeros.
  same = jnp.full((2 * k,), 0.1, jnp.float32)
  assert (np.asarray(adv_lib.rloo_advantages(same, k, normalize=True)) == 0).all()


def test_a_group_of_one_is_refused():
  with pytest.raises(ConfigError, match="at least 2"):
    adv_lib.rloo_advantages(jnp.zeros(4), 1)
  with pytest.raises(ConfigError, match="at least 2"):
    adv_lib.grpo_advantages(jnp.zeros(4), 1)
  with pytest.raises(ConfigError, match="groups of 3"):
    adv_lib.grpo_advantages(jnp.zeros(4), 3)


def test_kl_in_the_reward_and_the_truncation_penalty():
  logp, _, ref, mask, rewards = _batch(1)
  want = np.array([rewards[i] - 0.05 * sum((logp[i, t] - ref[i, t]) * mask[i, t]
                                           for t in range(T)) for i in range(P * K)])
  got = adv_lib.with_kl_penalty(*_f32(rewards, logp, ref, mask), 0.05)
  np.testing.assert_allclose(got, want, **TOL)
  finished = mask[:, -1] == 0  # the completions that stopped before the limit
  got = adv_lib.truncation_penalty(*_f32(rewards), jnp.asarray(finished), 1.5)
  np.testing.assert_allclose(got, np.where(finished, rewards, rewards - 1.5), **TOL)


def _np_log_weight(logp, old, mask, i, t, level):
  """TRL 1.9 GRPOTrainer's `log_importance_weights` (and its experimental gspo_token
  trainer's "sequence_token", whose value is the sequence's) at row i, token t."""
  if level == "token":
    return logp[i, t] - old[i, t]
  total = sum((logp[i, u] - old[i, u]) * mask[i, u] for u in range(T))
  if level == "sequence_sum":  # TRL 1.9 RLOOTrainer: logps.sum(1) - old_logps.sum(1)
    return total
  return total / max(mask[i].sum(), 1.0)


def _np_policy_loss(logp, old, ref, adv, mask, beta, eps_low, eps_high, kind, max_tokens,
                    level="token"):
  b = logp.shape[0]
  per_token = np.zeros_like(logp)
  for i in range(b):
    for t in range(T):
      ratio = np.exp(_np_log_weight(logp, old, mask, i, t, level))
      clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
      loss = -min(ratio * adv[i], clipped * adv[i])
      d = ref[i, t] - logp[i, t]
      per_token[i, t] = loss + beta * (np.exp(d) - d - 1)
  if kind == "sequence":  # TRL loss_type="grpo"
    return np.mean([(per_token[i] * mask[i]).sum() / max(mask[i].sum(), 1) for i in range(b)])
  if kind == "token":  # TRL loss_type="bnpo"
    return (per_token * mask).sum() / max(mask.sum(), 1)
  return (per_token * mask).sum() / (b * max_tokens)  # TRL loss_type="dr_grpo"


@pytest.mark.parametrize("kind", pg.AGGREGATIONS)
def test_clipped_policy_loss_with_k3_kl(kind):
  logp, old, ref, mask, rewards = _batch(2)
  adv = _np_grpo(rewards, K)
  want = _np_policy_loss(logp, old, ref, adv, mask, 0.04, 0.2, 0.28, kind, T)
  got, metrics = pg.policy_loss(*_f32(logp, old, ref, adv, mask), beta=0.04, eps_low=0.2,
                                eps_high=0.28, aggregation=kind, max_tokens=T)
  np.testing.assert_allclose(got, want, **TOL)
  kl = np.exp(ref - logp) - (ref - logp) - 1
  np.testing.assert_allclose(metrics["kl"], (kl * mask).sum() / mask.sum(), **TOL)
  assert 0 < float(metrics["clip_fraction"]) < 1
  # Tokens after the stop change nothing.
  noisy = np.where(mask > 0, logp, 50.0)
  again, _ = pg.policy_loss(*_f32(noisy, old, ref, adv, mask), beta=0.04, eps_low=0.2,
                            eps_high=0.28, aggregation=kind, max_tokens=T)
  np.testing.assert_allclose(again, got, **TOL)


@pytest.mark.parametrize("kind", pg.AGGREGATIONS)
def test_micro_batch_sums_add_up_to_the_batch_loss(kind):
  """The train loop sums each micro-batch's loss and normaliser and divides once: the
  result is the whole batch's loss, whatever the split (TRL's grpo loss over the batch)."""
  logp, old, ref, mask, rewards = _batch(3)
  adv = _np_grpo(rewards, K)
  want = _np_policy_loss(logp, old, ref, adv, mask, 0.04, 0.2, 0.2, kind, T)
  total = weight = 0.0
  for rows in (slice(0, 5), slice(5, 9), slice(9, P * K)):
    t, w, _ = pg.policy_loss_sums(*_f32(logp[rows], old[rows], ref[rows], adv[rows],
                                        mask[rows]), beta=0.04, eps_low=0.2, eps_high=0.2,
                                  aggregation=kind, max_tokens=T)
    total, weight = total + float(t), weight + float(w)
  np.testing.assert_allclose(total / weight, want, **TOL)


@pytest.mark.parametrize("level", ["sequence", "sequence_token", "sequence_sum"])
@pytest.mark.parametrize("kind", pg.AGGREGATIONS)
def test_sequence_level_ratios(level, kind):
  """GSPO's ratio (TRL 1.9 `importance_sampling_level="sequence"`), GSPO-token's and TRL
  RLOOTrainer's summed one: one ratio per completion, clipped per completion."""
  logp, _, ref, mask, rewards = _batch(7)
  old = logp + np.random.default_rng(8).normal(0, 0.05, logp.shape)
  adv = _np_grpo(rewards, K)
  eps = (3e-4, 4e-4) if level != "sequence_sum" else (0.2, 0.2)
  want = _np_policy_loss(logp, old, ref, adv, mask, 0.04, *eps, kind, T, level=level)
  got, metrics = pg.policy_loss(*_f32(logp, old, ref, adv, mask), beta=0.04, eps_low=eps[0],
                                eps_high=eps[1], aggregation=kind, max_tokens=T,
                                importance_level=level)
  np.testing.assert_allclose(got, want, **TOL)
  assert 0 < float(metrics["clip_fraction"]) < 1
  with pytest.raises(ConfigError, match="choose one of token, sequence"):
    pg.log_importance_weights(*_f32(logp, old, mask), level="geometric")


def _np_sequence_grad(logp, old, adv, mask, eps_low, eps_high, per_token_adv):
  """d/d logp of the "sequence" aggregation (TRL's loss_type="grpo") of GSPO's loss,
  by hand: the unclipped term's s_i A / |y_i| per token (0 where the clip is active),
  over B; GSPO-token with per-token advantages A_it: s_i A_it / |y_i|."""
  b = logp.shape[0]
  grad = np.zeros_like(logp)
  for i in range(b):
    n = max(mask[i].sum(), 1.0)
    s = np.exp(sum((logp[i, u] - old[i, u]) * mask[i, u] for u in range(T)) / n)
    for t in range(T):
      a = adv[i, t] if per_token_adv else adv[i]
      clipped = min(max(s, 1 - eps_low), 1 + eps_high)
      active = clipped * a < s * a  # the min takes the clipped, constant term
      grad[i, t] = 0.0 if active else -s * a * mask[i, t] / n / b
  return grad


def test_gspo_gradients_and_gspo_token_with_per_token_advantages():
  """With one advantage per completion GSPO-token's gradient is GSPO's (TRL's gspo_token
  docs); with per-token advantages each token's own advantage drives it."""
  logp, _, _, mask, rewards = _batch(9)
  old = logp + np.random.default_rng(10).normal(0, 3e-4, logp.shape)
  adv = _np_grpo(rewards, K)
  lp, o, m = _f32(logp, old, mask)

  def loss(x, a, level):
    return pg.policy_loss(x, o, None, a, m, beta=0.0, eps_low=3e-4, eps_high=4e-4,
                          aggregation="sequence", importance_level=level)[0]

  want = _np_sequence_grad(logp, old, adv, mask, 3e-4, 4e-4, per_token_adv=False)
  clipped_rows = (np.abs(want).sum(-1) == 0).sum()
  assert 0 < clipped_rows < len(want)  # both branches of the min are exercised
  (a,) = _f32(adv)
  for level in ("sequence", "sequence_token"):
    np.testing.assert_allclose(jax.grad(loss)(lp, a, level), want, **TOL)
  adv_t = np.random.default_rng(11).normal(0, 1, logp.shape) * mask
  want = _np_sequence_grad(logp, old, adv_t, mask, 3e-4, 4e-4, per_token_adv=True)
  (a_t,) = _f32(adv_t)
  np.testing.assert_allclose(jax.grad(loss)(lp, a_t, "sequence_token"), want, **TOL)


def test_on_the_first_update_the_gradient_is_reinforce():
  # ratio = 1 (old = logp, no gradient): the surrogate's gradient is -A / n per token.
  logp, _, _, mask, rewards = _batch(3)
  adv = jnp.asarray(_np_rloo(rewards, K), jnp.float32)
  (lp, m) = _f32(logp, mask)

  def loss(x):
    return pg.policy_loss(x, jax.lax.stop_gradient(x), None, adv, m, beta=0.0, eps_low=0.2,
                          eps_high=0.2, aggregation="token")[0]

  want = -np.asarray(adv)[:, None] * mask / mask.sum()
  np.testing.assert_allclose(jax.grad(loss)(lp), want, **TOL)


def test_unknown_aggregation_and_dr_grpo_without_a_length():
  x = jnp.zeros((2, 3))
  with pytest.raises(ConfigError, match="choose one of"):
    pg.aggregate(x, x, "mean")
  with pytest.raises(ConfigError, match="max_new_tokens"):
    pg.aggregate(x, x, "dr_grpo")


def test_gae_and_the_clipped_value_loss():
  rng = np.random.default_rng(4)
  logp, _, _, mask, _ = _batch(4)
  b = logp.shape[0]
  rewards = rng.normal(0, 1, (b, T)) * mask
  values = rng.normal(0, 1, (b, T))
  gamma, lam = 0.99, 0.95
  want_adv = np.zeros((b, T))
  v = values * mask
  for i in range(b):
    last = 0.0
    for t in reversed(range(T)):  # TRL PPOTrainer's recursion
      next_value = v[i, t + 1] if t < T - 1 else 0.0
      delta = rewards[i, t] + gamma * next_value - v[i, t]
      last = delta + gamma * lam * last
      want_adv[i, t] = last
  want_adv *= mask
  adv, returns = adv_lib.gae(*_f32(rewards, values, mask), gamma, lam)
  np.testing.assert_allclose(adv, want_adv, **TOL)
  np.testing.assert_allclose(returns, (want_adv + v) * mask, **TOL)

  old = values + rng.normal(0, 0.5, (b, T))
  ret = np.asarray(returns, np.float64)
  clipped = np.clip(values, old - 0.2, old + 0.2)
  worst = np.maximum((values - ret) ** 2, (clipped - ret) ** 2)
  want = 0.5 * (worst * mask).sum() / mask.sum()
  np.testing.assert_allclose(pg.value_loss(*_f32(values, old, ret, mask), 0.2), want, **TOL)


def test_gae_over_multi_turn_rows_steps_from_one_answer_to_the_next():
  """A multi-turn row's mask has gaps (the user's turns, rl/multiturn.py): TRL's
  recursion runs over the masked tokens in order, so an answer's last token bootstraps
  from the next answer's first; the score lands on the row's last masked token."""
  rng = np.random.default_rng(8)
  b, t = 4, 12
  mask = np.zeros((b, t))
  mask[0, [0, 1, 2, 6, 7]] = 1          # two answers
  mask[1, [1, 2, 5, 9, 10, 11]] = 1     # three
  mask[2, :5] = 1                       # one (single-turn)
  mask[3, [3]] = 1
  rewards = rng.normal(0, 1, (b, t)) * mask
  values = rng.normal(0, 1, (b, t))
  gamma, lam = 0.9, 0.8
  want_adv, want_ret = np.zeros((b, t)), np.zeros((b, t))
  for i in range(b):
    steps = np.flatnonzero(mask[i])
    last = 0.0
    for j in reversed(range(len(steps))):
      next_value = values[i, steps[j + 1]] if j + 1 < len(steps) else 0.0
      delta = rewards[i, steps[j]] + gamma * next_value - values[i, steps[j]]
      last = delta + gamma * lam * last
      want_adv[i, steps[j]] = last
      want_ret[i, steps[j]] = last + values[i, steps[j]]
  adv, returns = adv_lib.gae(*_f32(rewards, values, mask), gamma, lam)
  np.testing.assert_allclose(adv, want_adv, **TOL)
  np.testing.assert_allclose(returns, want_ret, **TOL)

  scores = rng.normal(0, 1, b)
  logp, ref = rng.normal(-1, 0.3, (b, t)), rng.normal(-1, 0.3, (b, t))
  want = -0.05 * (logp - ref) * mask
  for i in range(b):
    want[i, np.flatnonzero(mask[i])[-1]] += scores[i]
  np.testing.assert_allclose(adv_lib.token_rewards(*_f32(scores, logp, ref, mask), 0.05),
                             want, **TOL)


def test_ppo_token_rewards_and_whitened_advantages():
  """TRL PPOTrainer: rewards = -kl_coef * (logprobs - ref_logprobs), the score added at
  the completion's last token; advantages = masked_whiten(advantages, mask) (unbiased
  variance, eps 1e-8), zero on padding."""
  logp, _, ref, mask, scores = _batch(5)
  b = logp.shape[0]
  want = -0.05 * (logp - ref) * mask
  for i in range(b):
    want[i, int(mask[i].sum()) - 1] += scores[i]
  got = adv_lib.token_rewards(*_f32(scores, logp, ref, mask), 0.05)
  np.testing.assert_allclose(got, want, **TOL)

  x = np.random.default_rng(6).normal(2.0, 3.0, (b, T))
  valid = x[mask > 0]
  mean, var = valid.mean(), valid.var(ddof=1)
  want = (x - mean) / np.sqrt(var + 1e-8) * mask
  np.testing.assert_allclose(adv_lib.whiten(*_f32(x, mask)), want, **TOL)
