"""Rollout rewards: the weighted reward, its normalisation, the steering term.

References: HelpSteer2's reward formula written out here (0.65 helpfulness + 0.8
correctness + 0.45 coherence, standardised), NumPy's mean and std over all rewards seen
(the running moments), and the distance to the requested attribute values by hand.
"""

import numpy as np
import pytest

from helpsteer_jax.config_sections import helpsteer2_weights
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.rl import rewards


def _preds(n, seed=0):
  return np.random.default_rng(seed).uniform(0, 4, (n, len(ATTRIBUTES))).astype(np.float32)


# The HelpSteer2 paper's PPO reward (section on PPO).
PPO_WEIGHTS = {"helpfulness": 0.65, "correctness": 0.8, "coherence": 0.45}


def test_helpsteer2_reward_standardised():
  preds = _preds(5)
  col = {a: preds[:, ATTRIBUTES.index(a)].astype(np.float64) for a in ATTRIBUTES}
  want = (0.65 * col["helpfulness"] + 0.8 * col["correctness"] + 0.45 * col["coherence"]
          - 2.5) / 1.5
  got = rewards.rollout_rewards(preds, PPO_WEIGHTS, mean=2.5, std=1.5)
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_running_moments_equal_numpy_over_everything_seen():
  moments, seen = rewards.RunningMoments(), []
  for seed, n in enumerate((3, 1, 7, 4)):
    batch = _preds(n, seed)
    got = rewards.rollout_rewards(batch, helpsteer2_weights(), mean=None, moments=moments)
    raw = batch.astype(np.float64) @ np.asarray(
        [helpsteer2_weights()[a] for a in ATTRIBUTES])
    seen.extend(raw)
    want = (raw - np.mean(seen)) / (np.std(seen, ddof=1) if len(seen) > 1 else 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
  assert moments.count == 15


def test_steering_term_and_refusals():
  preds = _preds(3)
  requested = [{"complexity": 1, "verbosity": 3}, None, {"verbosity": 0, "helpfulness": 4}]
  c, v = ATTRIBUTES.index("complexity"), ATTRIBUTES.index("verbosity")
  distance = [(abs(preds[0, c] - 1) + abs(preds[0, v] - 3)) / 2, 0.0, abs(preds[2, v])]
  np.testing.assert_allclose(rewards.steering_distance(preds, requested), distance,
                             rtol=1e-6)
  base = rewards.rollout_rewards(preds, helpsteer2_weights())
  steered = rewards.rollout_rewards(preds, helpsteer2_weights(), requested=requested,
                                    steer_coef=0.5)
  np.testing.assert_allclose(steered, base - 0.5 * np.asarray(distance), rtol=1e-6)
  with pytest.raises(ConfigError, match="requested attributes"):
    rewards.rollout_rewards(preds, helpsteer2_weights(), steer_coef=0.5)
  preds[1, 0] = np.nan
  with pytest.raises(ConfigError, match=r"rollouts \[1\]"):
    rewards.rollout_rewards(preds, helpsteer2_weights())
