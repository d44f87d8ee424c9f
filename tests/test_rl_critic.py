"""PPO's critic: its starting points (the policy's backbone, or the attribute model with
the reward's weighting as its head) and its values at the completion tokens.

Reference: the attribute model's own per-token outputs, weighted and standardised in
NumPy, read at the positions that predict each completion token (TRL PPOTrainer reads
its value head where it reads the policy's logits).
"""

import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpsteer_jax import runtime
from helpsteer_jax.config_sections import DEMO_SHAPE
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import catalog, reward_hf
from helpsteer_jax.models.reward import reward_model
from helpsteer_jax.rl import critic, settings
from helpsteer_jax.runs import policy
from helpsteer_jax.scoring.load import load_reward_model
from helpsteer_jax.scoring.rewards import weight_vector
from helpsteer_jax.train import state as state_lib

from conftest import REPO_ROOT


def _config(**overrides):
  config = runpy.run_path(str(REPO_ROOT / "configs" / "rl.py"))["get_config"]()
  config.model.update(**DEMO_SHAPE)
  config.init.source = ""
  config.mesh.update(data=2, fsdp=2, tensor=2)
  config.algorithm = "ppo"
  config.update(overrides)
  return config


def _rows(vocab):
  rng = np.random.default_rng(0)
  inputs = rng.integers(0, vocab, (4, 32)).astype(np.int32)
  return {"inputs": jnp.asarray(inputs),
          "positions": jnp.broadcast_to(jnp.arange(32, dtype=jnp.int32), (4, 32)),
          "segment_ids": jnp.ones((4, 32), jnp.int32),
          "at": jnp.asarray(np.arange(9, 9 + 12)[None].repeat(4, 0), jnp.int32)}


def test_a_critic_from_the_scorer_values_states_as_the_reward_does(tmp_path):
  model = reward_model(catalog.model_config("tiny", **DEMO_SHAPE), seed=1)
  kernel = model.head.kernel
  kernel[...] = np.random.default_rng(0).normal(size=kernel[...].shape).astype(np.float32)
  reward_hf.save_reward_hf(model, tmp_path / "rm", dtype="float32")
  config = _config()
  config.scorer.source = str(tmp_path / "rm")
  config.loss.critic_init = "scorer"
  config.reward.update(normalize="fixed", mean=1.5, std=2.0)
  s = settings.read(config)
  rt = runtime.setup(config)
  w = weight_vector(config.scorer.weights.to_dict())
  parts = critic.from_scorer(config, rt, s, w, model.cfg.vocab_size)
  batch = _rows(model.cfg.vocab_size)
  got = np.asarray(critic.completion_values(state_lib.merge_model(parts, parts.params), batch))

  rm = load_reward_model(str(tmp_path / "rm"), rt, config.scorer.model)
  outputs = np.asarray(rm(batch["inputs"], batch["positions"], batch["segment_ids"]), np.float64)
  want = np.take_along_axis((outputs @ w - 1.5) / 2.0, np.asarray(batch["at"]), axis=1)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

  with pytest.raises(ConfigError, match="vocabulary"):
    critic.from_scorer(config, rt, s, w, model.cfg.vocab_size + 1)


@pytest.mark.parametrize("rank", [0, 4])
def test_a_critic_from_the_policy_starts_on_its_backbone(rank):
  config = _config()
  config.model.lora.rank = rank
  rt = runtime.setup(config)
  parts, _ = policy.load_policy(config, rt)
  built = critic.from_policy(config, rt, parts)
  mine = built.base if rank else built.params
  theirs = parts.base if rank else parts.params
  for path, leaf in jax.tree_util.tree_leaves_with_path(mine["backbone"]):
    other = theirs
    for key in path:
      other = other[key.key]
    if rank:  # LoRA: the policy's frozen base, shared rather than copied
      assert leaf is other
    else:
      assert leaf is not other
      np.testing.assert_array_equal(np.asarray(leaf), np.asarray(other))
  assert "lm_head" not in mine["backbone"]
  head = built.params["head"]
  assert not np.any(np.asarray(head["kernel"])) and not np.any(np.asarray(head["bias"]))
