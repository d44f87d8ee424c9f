"""One-step-off-policy rollouts (`rollout.max_staleness=1`, rl/off_policy.py): each
iteration's rollouts are sampled on the rollout devices during the previous update, with
the weights before it, and the loss's ratio is taken against those weights' log-probs.
"""

import collections

import numpy as np
import pytest
from test_rl_resume import assert_resumes
from test_rl_task import _config, _train_rows

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.rl import off_policy, settings
from helpsteer_jax.tasks import rl as task

# 4 of the 8 test devices train (config.mesh), 4 sample (rollout.mesh: data-parallel)
OFF = {"rollout.max_staleness": 1, "mesh.data": 1}


def test_rollouts_are_sampled_one_update_behind(tmp_path):
  """Iteration 1's rollouts are those of the starting weights, as iteration 0's, so its
  behaviour log-probs are the reference's (KL 0) while the policy has moved (ratios off
  1, some clipped, with one update per iteration); iteration 0 is the on-policy run's.
  On-policy, iteration 1's KL is the update's and no ratio is clipped."""
  common = {"algorithm": "grpo", "train.num_steps": 3, "prompts.eval_limit": 2,
            "loss.recompute_logprobs": True}
  task.run(_config(**common), str(tmp_path / "on"))
  task.run(_config(**common, **OFF), str(tmp_path / "off"))
  on, off = _train_rows(tmp_path / "on"), _train_rows(tmp_path / "off")
  assert [off[i]["staleness"] for i in (1, 2, 3)] == [0.0, 1.0, 1.0]
  assert "staleness" not in on[1]
  for key in ("reward", "response_length", "truncated"):
    assert off[1][key] == on[1][key], key
  for key in ("loss", "grad_norm", "kl", "entropy"):
    np.testing.assert_allclose(off[1][key], on[1][key], rtol=1e-4, atol=1e-6, err_msg=key)
  assert abs(off[2]["kl"]) < 1e-5 and on[2]["kl"] > 1e-3
  assert on[2]["clip_fraction"] == 0.0 and off[2]["clip_fraction"] > 0.0
  assert off[3]["kl"] > 1e-3
  assert all(off[i]["rollout_wait_s"] >= 0.0 for i in (1, 2, 3))


def test_a_resumed_off_policy_run_repeats_the_uninterrupted_one(tmp_path):
  """The batch sampled ahead is checkpointed: stopped after iteration 1 and resumed,
  iteration 2 trains on the rollouts of the starting weights, as the uninterrupted run."""
  assert_resumes(_config(algorithm="grpo", **OFF, **{"prompts.eval_limit": 2}), tmp_path,
                 ("reward", "reward_normalized", "kl", "loss", "response_length",
                  "clip_fraction", "staleness"))


def test_the_ahead_batch_round_trips_through_the_checkpoint_state():
  from helpsteer_jax.rl.rollout import Rollouts
  from helpsteer_jax.rl.trainer import HostState
  rng = np.random.default_rng(0)
  r = Rollouts([[1, 2], [3]], 2, rng.integers(0, 9, (4, 5)).astype(np.int32),
               np.ones((4, 5), np.float32), rng.normal(size=(4, 5)).astype(np.float32),
               np.array([True, False, True, True]), ["a", "b", "é", ""])
  host = HostState()
  host.moments.update(np.array([1.0, 2.0, 4.0]))
  host.ahead = off_policy._encode(off_policy.Sampled(3, 2, r, rng.normal(size=(4, 5)), 1.5))
  back = HostState()
  back.set_state(host.get_state())
  got = off_policy._decode(back.ahead)
  assert (got.iteration, got.version, got.seconds, got.rollouts.k) == (3, 2, 1.5, 2)
  assert got.rollouts.prompts == r.prompts and got.rollouts.texts == r.texts
  for k in ("tokens", "mask", "sampler_logp", "finished"):
    np.testing.assert_array_equal(getattr(got.rollouts, k), getattr(r, k))
  assert back.moments == host.moments
  old = HostState()  # a checkpoint of an on-policy run
  old.set_state(HostState().get_state())
  assert old.ahead is None


Device = collections.namedtuple("Device", "id process_index")


def test_devices_split_within_every_process():
  devices = [Device(i, i // 4) for i in range(8)]
  train, roll = off_policy.split_devices(0, devices)
  assert [d.id for d in train] == [0, 1, 4, 5] and [d.id for d in roll] == [2, 3, 6, 7]
  train, roll = off_policy.split_devices(2, devices)
  assert [d.id for d in train] == [0, 1, 2, 4, 5, 6] and [d.id for d in roll] == [3, 7]
  for bad in (1, 3, 8):
    with pytest.raises(ConfigError, match="rollout.devices"):
      off_policy.split_devices(bad, devices)
  with pytest.raises(ConfigError, match="at least two devices per process"):
    off_policy.split_devices(0, [Device(0, 0), Device(1, 1)])


def test_impossible_staleness_settings_fail_before_compiling():
  with pytest.raises(ConfigError, match="max_staleness=2"):
    settings.read(_config(**{"rollout.max_staleness": 2}))
  with pytest.raises(ConfigError, match="dynamic sampling"):
    settings.read(_config(algorithm="dapo", **{"rollout.max_staleness": 1}))
  s = settings.read(_config(algorithm="grpo", **OFF))
  assert s.max_staleness == 1 and s.recomputes_old_logp
