"""Learning-rate schedules against NeMo's CosineAnnealing formula."""

import math

import numpy as np
import pytest

from helpsteer_jax import config_sections
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.train import optim

pytestmark = pytest.mark.version_tier


def _nemo_cosine_annealing(step, max_steps, lr, min_lr, warmup, constant):
  """NeMo core/optim/lr_scheduler.py CosineAnnealing (+ its warmup), step 0-based.

  NeMo counts steps from 1 in the scheduler; with step + 1 the warmup reaches
  `lr` at the end of the warmup and the constant tail holds `min_lr`.
  """
  s = step + 1
  if warmup > 0 and s <= warmup:
    return lr * s / warmup
  decay = max_steps - warmup - constant
  if constant > 0 and warmup + decay < s:
    return min_lr
  progress = min(max(s - warmup - 1, 0) / decay, 1.0) if decay else 1.0
  return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


def test_cosine_with_constant_tail_matches_recipe():
  opt = config_sections.optimizer_config(lr=6e-6, min_lr=5e-6, warmup_steps=1, constant_steps=200)
  schedule = optim.learning_rate_schedule(opt, 800)
  values = np.array([float(schedule(s)) for s in range(800)])
  assert values[0] == pytest.approx(6e-6)
  assert np.all(np.diff(values[1:600]) <= 1e-15)           # monotone decay
  np.testing.assert_allclose(values[600:], 5e-6, rtol=1e-6)  # 200 constant steps
  assert values[300] == pytest.approx(5.5e-6, rel=2e-2)    # half way down the cosine
  expected = [_nemo_cosine_annealing(s, 800, 6e-6, 5e-6, 1, 200) for s in range(800)]
  np.testing.assert_allclose(values, expected, rtol=1e-5)


def test_warmup_is_linear_then_constant():
  opt = config_sections.optimizer_config(lr=2e-6, schedule="constant", warmup_steps=10)
  schedule = optim.learning_rate_schedule(opt, 317)
  np.testing.assert_allclose([float(schedule(s)) for s in range(12)],
                             [2e-6 * (s + 1) / 10 for s in range(10)] + [2e-6, 2e-6], rtol=1e-6)


def test_impossible_schedule_is_a_config_error():
  with pytest.raises(ConfigError, match="must be fewer than train.num_steps"):
    optim.learning_rate_schedule(
        config_sections.optimizer_config(warmup_steps=50, constant_steps=60), 100)
  with pytest.raises(ConfigError, match="choose one of"):
    optim.learning_rate_schedule(config_sections.optimizer_config(schedule="linear"), 100)


def test_weight_decay_skips_norms_and_biases():
  import jax.numpy as jnp
  params = {"embed": jnp.ones((4, 2)), "final_norm": {"scale": jnp.ones(2)},
            "layers": {"attn": {"q_bias": jnp.ones((2, 2))}}}
  mask = optim._decay_mask(params)
  assert mask == {"embed": True, "final_norm": {"scale": False},
                  "layers": {"attn": {"q_bias": False}}}


def test_apply_if_finite_matches_optax_and_has_no_conditional():
  import jax
  import jax.numpy as jnp
  import optax
  opt = config_sections.optimizer_config(lr=1e-2, warmup_steps=0, schedule="constant")
  ours, _ = optim.make_optimizer(opt, 10)
  inner = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, b1=opt.b1, b2=opt.b2,
                                                                  weight_decay=opt.weight_decay,
                                                                  mask=optim._decay_mask))
  ref = optax.apply_if_finite(inner, max_consecutive_errors=2)
  ours = optim.apply_if_finite(inner, max_consecutive_errors=2)
  params = {"w": jnp.arange(6.0).reshape(2, 3), "norm": jnp.ones(3)}
  grads = [{"w": jnp.full((2, 3), v), "norm": jnp.full(3, -v)}
           for v in (0.5, jnp.nan, 2.0, jnp.inf, jnp.nan, jnp.nan, 1.0)]
  p_ref, s_ref, p_ours, s_ours = params, ref.init(params), params, ours.init(params)
  for g in grads:  # skips, then gives up after 2 in a row, as optax does
    u, s_ref = ref.update(g, s_ref, p_ref)
    p_ref = optax.apply_updates(p_ref, u)
    u, s_ours = ours.update(g, s_ours, p_ours)
    p_ours = optax.apply_updates(p_ours, u)
    for a, b in zip(jax.tree.leaves((p_ref, s_ref)), jax.tree.leaves((p_ours, s_ours))):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
  assert jax.tree.structure(s_ref) == jax.tree.structure(s_ours)
  assert int(s_ours.total_notfinite) == 4
  tx, _ = optim.make_optimizer(opt, 10)
  hlo = jax.jit(tx.update).lower(grads[0], tx.init(params), params).as_text()
  assert "conditional" not in hlo and "stablehlo.case" not in hlo
