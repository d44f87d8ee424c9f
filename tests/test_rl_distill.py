"""On-policy distillation (`algorithm=distill`): the per-token reverse KL against a NumPy
re-derivation of TRL's `generalized_jsd_loss` (trl/trainer/gkd_trainer.py) at beta=1,
its chunking and gradient, the reward term's mixing, and the rl task end to end with a
teacher read from an HF directory (stopped and resumed: the uninterrupted run).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_rl_resume import assert_resumes
from test_rl_task import _config, _train_rows

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.losses import advantages as adv_lib
from helpsteer_jax.losses import distillation
from helpsteer_jax.rl import settings
from helpsteer_jax.rl import teacher as teacher_lib
from helpsteer_jax.rl.algorithms.base import LossSettings
from helpsteer_jax.rl.algorithms.distill import Distill
from helpsteer_jax.tasks import rl as task

V, T = 37, 6


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _kl_div(inp, target):
  """torch.nn.functional.kl_div(inp, target, reduction="none", log_target=True)."""
  return np.exp(target) * (target - inp)


def trl_generalized_jsd_loss(student_logits, teacher_logits, labels=None, beta=0.5,
                             temperature=1.0, reduction="batchmean"):
  """TRL GKDTrainer.generalized_jsd_loss in NumPy (float64)."""
  s = _log_softmax(student_logits / temperature)
  t = _log_softmax(teacher_logits / temperature)
  if beta == 0:
    jsd = _kl_div(s, t)
  elif beta == 1:
    jsd = _kl_div(t, s)
  else:
    m = np.logaddexp(s + np.log(1 - beta), t + np.log(beta))
    jsd = beta * _kl_div(m, t) + (1 - beta) * _kl_div(m, s)
  mask = labels != -100
  jsd = jsd[mask]
  assert reduction == "batchmean"
  return jsd.sum() / mask.sum()


def _case(rng, b, truncated):
  """Random [b, T, V] logits as hidden states through an identity head, and the mask:
  lengths in 1..T (masked tails) or all T (completions cut at max_new_tokens)."""
  hs = rng.normal(0, 3.0, (b, T, V)).astype(np.float32)  # the student sharper: the two
  ht = rng.normal(0, 1.0, (b, T, V)).astype(np.float32)  # directions then differ
  lengths = np.full(b, T) if truncated else rng.integers(1, T + 1, b)
  mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
  return hs, ht, mask


class _View:
  def __init__(self, **fields):
    self.__dict__.update({k: jnp.asarray(v, jnp.float32) for k, v in fields.items()})


COMMON = LossSettings(eps_low=0.2, eps_high=0.2, aggregation="token", max_tokens=T)
EYE = jnp.eye(V, dtype=jnp.float32)


@pytest.mark.parametrize("k", [2, 8])
@pytest.mark.parametrize("truncated", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_loss_is_trl_gkd_at_beta_1(k, truncated, temperature):
  """P=2 prompts x K samples; the token-aggregated loss equals TRL's batchmean over the
  completion tokens (labels -100 past each mask) to 1e-5 in fp32, and is not beta=0's
  (the forward KL)."""
  rng = np.random.default_rng(k + 10 * truncated)
  hs, ht, mask = _case(rng, 2 * k, truncated)
  kl = distillation.reverse_kl(jnp.asarray(hs), EYE, jnp.asarray(ht), EYE, chunk_size=0,
                               temperature=temperature)
  adv = np.zeros_like(mask)
  total, weight, sums = Distill().loss_sums(jnp.zeros_like(kl), jnp.zeros_like(kl),
                                            _View(mask=mask, advantages=adv), COMMON, kl)
  labels = np.where(mask > 0, 1, -100)
  ref = trl_generalized_jsd_loss(hs.astype(np.float64), ht.astype(np.float64), labels, 1.0,
                                 temperature)
  np.testing.assert_allclose(float(total / weight), ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(sums["teacher_kl"] / sums["tokens"]), ref, rtol=1e-5)
  forward = trl_generalized_jsd_loss(hs.astype(np.float64), ht.astype(np.float64), labels,
                                     0.0, temperature)
  assert abs(float(total / weight) - forward) > 1e-2 * ref


def test_chunks_equal_one_pass_and_the_gradient_is_the_analytic_one():
  """Chunks of 4 over T=6 (the last padded) equal one chunk, with a real head; the
  gradient w.r.t. the student's logits is p_s (log p_s - log p_t - KL) / temperature per
  position (the NumPy derivative of the reverse KL), none reaches the teacher."""
  rng = np.random.default_rng(0)
  d, tau = 8, 0.8
  hs, ht = (jnp.asarray(rng.normal(size=(3, T, d)), jnp.float32) for _ in range(2))
  ws, wt = (jnp.asarray(rng.normal(size=(d, V)), jnp.float32) for _ in range(2))
  one = distillation.reverse_kl(hs, ws, ht, wt, chunk_size=0, temperature=tau)
  chunked = distillation.reverse_kl(hs, ws, ht, wt, chunk_size=4, temperature=tau)
  np.testing.assert_allclose(np.asarray(chunked), np.asarray(one), rtol=1e-6, atol=1e-7)
  g_one = jax.grad(lambda h, w: distillation.reverse_kl(h, w, ht, wt, 0, tau).sum(),
                   (0, 1))(hs, ws)
  g_chunked = jax.grad(lambda h, w: distillation.reverse_kl(h, w, ht, wt, 4, tau).sum(),
                       (0, 1))(hs, ws)
  for a, b in zip(g_chunked, g_one):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)

  zs, zt, mask = _case(rng, 4, False)
  g, g_teacher = jax.grad(lambda s, t: (distillation.reverse_kl(s, EYE, t, EYE, 4, tau)
                                        * mask).sum(), (0, 1))(jnp.asarray(zs), jnp.asarray(zt))
  ls, lt = _log_softmax(zs.astype(np.float64) / tau), _log_softmax(zt.astype(np.float64) / tau)
  p = np.exp(ls)
  kl = (p * (ls - lt)).sum(-1, keepdims=True)
  expected = p * (ls - lt - kl) / tau * mask[..., None]
  np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-4, atol=1e-6)
  assert not np.any(np.asarray(g_teacher))


def test_the_reward_term_mixes_in_grpo_on_the_group_advantages():
  """reward_coef c: loss = token mean of KL + c x token mean of the clipped surrogate on
  GRPO's advantages (ratio 1: -A per token), one normaliser; c = 0 trains on the KL
  alone (zero advantages)."""
  rng = np.random.default_rng(3)
  k, b = 4, 8
  mask = (np.arange(T)[None] < rng.integers(1, T + 1, b)[:, None]).astype(np.float32)
  kl = rng.uniform(0, 2, (b, T)).astype(np.float32)
  logp = -rng.uniform(0.1, 3, (b, T)).astype(np.float32)
  scores = rng.normal(size=b)
  rows = {"mask": mask}
  assert not Distill().advantages(rows, scores, k, logp, logp).any()
  algo = Distill(reward_coef=0.5)
  adv = algo.advantages(rows, scores, k, logp, logp)
  np.testing.assert_array_equal(
      adv, np.asarray(adv_lib.grpo_advantages(jnp.asarray(scores, jnp.float32), k))[:, None]
      * mask)
  view = _View(mask=mask, advantages=adv)

  def loss(lp):
    total, weight, _ = algo.loss_sums(lp, jax.lax.stop_gradient(lp), view, COMMON,
                                      jnp.asarray(kl))
    return total / weight

  n = mask.sum()
  np.testing.assert_allclose(float(loss(jnp.asarray(logp))),
                             ((kl * mask).sum() - 0.5 * (adv * mask).sum()) / n, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(jax.grad(loss)(jnp.asarray(logp))),
                             -0.5 * adv * mask / n, rtol=1e-5, atol=1e-7)


def test_settings_and_the_teacher_are_checked_before_compiling(tmp_path):
  s = settings.read(_config(algorithm="distill", **{"rollout.samples_per_prompt": 1,
                                                     "train.global_batch": 4}))
  assert s.aggregation == "token" and not s.uses_reference and s.algorithm.min_samples == 1
  with pytest.raises(ConfigError, match="at least 2"):
    settings.read(_config(algorithm="distill", **{"rollout.samples_per_prompt": 1,
                                                   "train.global_batch": 4,
                                                   "loss.reward_coef": 0.5}))
  with pytest.raises(ConfigError, match="loss.reward_coef=-1"):
    settings.read(_config(algorithm="distill", **{"loss.reward_coef": -1.0}))
  with pytest.raises(ConfigError, match="set --config.teacher.source="):
    task.run(_config(algorithm="distill"), str(tmp_path / "none"))
  other = _teacher_dir(tmp_path / "wide", vocab_size=512)
  with pytest.raises(ConfigError, match="has 512 tokens, the policy's 1024"):
    task.run(_config(algorithm="distill", **{"teacher.source": str(other)}),
             str(tmp_path / "wide_run"))


def _teacher_dir(path, **shape):
  """A random HF teacher, larger than the tests' one-layer policy."""
  if not path.exists():
    from helpsteer_jax.models import builder, catalog, hf
    cfg = catalog.model_config("tiny", **{"hidden_size": 64, "intermediate_size": 128,
                                          "num_layers": 2, **shape})
    hf.save_hf_model(builder.create(cfg, seed=7), path, dtype="float32")
  return path


def _distill(tmp_path, **overrides):
  return _config(algorithm="distill", **{
      "teacher.source": str(_teacher_dir(tmp_path / "teacher")), "prompts.eval_limit": 2,
      **overrides})


def test_the_teacher_kl_falls(tmp_path):
  """Four iterations of pure distillation from a two-layer teacher: the student's reverse
  KL to it per token falls at every iteration (each on fresh samples), the loss is that
  KL, nothing is clipped."""
  config = _distill(tmp_path, **{"train.num_steps": 4, "optimizer.lr": 3e-3})
  summary = task.run(config, str(tmp_path / "run"))
  assert summary["status"] == "finished" and summary["algorithm"] == "distill"
  rows = _train_rows(tmp_path / "run")
  kls = [rows[i]["teacher_kl"] for i in sorted(rows)]
  assert all(np.isfinite(kls)) and all(np.diff(kls) < 0) and kls[-1] < 0.8 * kls[0], kls
  for r in rows.values():
    assert r["clip_fraction"] == 0.0
    # One optimizer step per iteration: the loss is the step's token-mean KL.
    np.testing.assert_allclose(r["loss"], r["teacher_kl"], rtol=1e-5)


def test_a_resumed_distillation_repeats_the_uninterrupted_one(tmp_path):
  """With the reward's term mixed in: stopped after iteration 1 and resumed, iteration 2
  and the weights are the uninterrupted run's (the teacher is read again, unchanged)."""
  assert_resumes(_distill(tmp_path, **{"loss.reward_coef": 0.5}), tmp_path,
                 ("reward", "teacher_kl", "loss", "response_length", "grad_norm"))


def test_the_teacher_config_takes_the_teachers_own_shape():
  config = _config(algorithm="distill", **{"teacher.source": "/t", "teacher.model.num_heads": 8,
                                           "model.lora.rank": 4})
  tc = teacher_lib.teacher_config(config)
  assert tc.init.source == "/t" and tc.model.num_heads == 8 and tc.model.lora.rank == 0
  assert tc.model.hidden_size is None and config.model.hidden_size == 32
