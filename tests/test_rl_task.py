"""The rl task end to end on a tiny policy: the reward rises, the first iteration's
ratios and KL are exactly those of an unchanged policy, LoRA's reference is the base, and
bad settings fail before compiling (resuming: tests/test_rl_resume.py).

The reward is a user's factory scorer (`fake_scorer.make_brevity`: shorter answers score
higher), which a random policy can learn within a few iterations.
"""

import json

import numpy as np
import pytest

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.rl import settings
from helpsteer_jax.tasks import rl as task

from train_utils import task_config_overrides, tiny_policy_config


def _config(**overrides):
  config = tiny_policy_config("rl")
  config.scorer.source = "fake_scorer:make_brevity"
  config.prompts.update(demo_train_prompts=16, eval_limit=8)
  config.rollout.update(prompts_per_iteration=4, samples_per_prompt=4, max_new_tokens=16)
  config.train.update(num_steps=3, global_batch=16, micro_batch=8, seq_len=128, eval_every=0,
                      save_every=1, export_hf=False, loss_chunk_size=64, async_checkpoint=False)
  config.optimizer.update(lr=3e-2)
  return task_config_overrides(config, overrides)


def _rows(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _train_rows(workdir):
  return {r["step"]: r for r in _rows(workdir) if "reward" in r}


def test_the_reward_of_greedy_answers_rises(tmp_path):
  config = _config(algorithm="grpo", **{"train.num_steps": 8})
  summary = task.run(config, str(tmp_path))
  assert summary["status"] == "finished" and summary["iteration"] == 8
  assert summary["eval_reward_after"] > summary["eval_reward_before"] + 0.5, summary
  train = _train_rows(tmp_path)
  for row in train.values():
    assert np.isfinite(row["kl"]) and row["kl"] < 50.0
    assert 0.0 <= row["truncated"] <= 1.0 and row["rollout_tokens_per_s"] > 0
  samples = sorted((tmp_path / "samples").glob("*.jsonl"))
  assert [p.name for p in samples] == ["iteration_000000.jsonl", "iteration_000008.jsonl"]
  first = json.loads(samples[0].read_text().splitlines()[0])
  assert {"prompt", "attributes", "response", "reward", "scores"} <= set(first)
  assert (tmp_path / "rl_curves.png").stat().st_size > 0


def test_the_first_iteration_is_on_policy_and_lora_references_the_base(tmp_path):
  """Iteration 1 samples from the reference with ratios of 1: KL 0, nothing clipped (the
  old log-probs recomputed, so the KL compares two passes of one path); with
  fresh LoRA adapters the reference is the base (the adapters off), which the policy
  leaves at iteration 2."""
  config = _config(algorithm="rloo", **{"train.num_steps": 2, "prompts.eval_limit": 2,
                                         "loss.recompute_logprobs": True})
  config.model.lora.rank = 4
  task.run(config, str(tmp_path))
  rows = _train_rows(tmp_path)
  assert rows[1]["kl"] == 0.0 and rows[1]["clip_fraction"] == 0.0
  assert rows[2]["kl"] != 0.0
  # The engine decodes the updated, merged weights: its sampler agrees with the trainer.
  assert rows[2]["sampler_logp_gap"] < 1e-3
@pytest.mark.parametrize("algorithm, overrides", [
    ("gspo", {"loss.importance_level": "sequence_token"}),
    ("rloo", {"loss.rloo_form": "trl"})])
def test_sequence_ratio_forms_train_off_policy(tmp_path, algorithm, overrides):
  """GSPO(-token) and TRL's RLOO form end to end with two epochs, so that the second
  pass's ratios per completion move off 1 and their clip range acts."""
  config = _config(algorithm=algorithm, **{"train.num_steps": 2, "prompts.eval_limit": 2,
                                            "loss.epochs": 2, **overrides})
  summary = task.run(config, str(tmp_path))
  assert summary["status"] == "finished"
  rows = _train_rows(tmp_path)
  assert all(np.isfinite(r["loss"]) and 0 <= r["clip_fraction"] <= 1 for r in rows.values())
  assert any(r["clip_fraction"] > 0 for r in rows.values())


@pytest.mark.parametrize("overrides, message", [
    ({"algorithm": "rloo", "rollout.samples_per_prompt": 1}, "at least 2"),
    ({"algorithm": "grpo", "rollout.samples_per_prompt": 1}, "at least 2"),
    ({"algorithm": "a2c"}, "choose one of rloo, grpo, ppo"),
    ({"train.global_batch": 5}, "must divide the 16 completions"),
    ({"rollout.max_new_tokens": 128}, "rollout.max_new_tokens=128"),
    ({"rollout.temperature": 0.0}, "must be > 0"),
    ({"loss.aggregation": "mean"}, "loss.aggregation='mean'"),
    ({"reward.normalize": "fixed", "reward.std": 0.0}, "std > 0"),
    ({"reward.steer_attributes": "humor"}, "not steerable"),
])
def test_bad_settings_fail_before_compiling(overrides, message):
  with pytest.raises(ConfigError, match=message):
    settings.read(_config(**overrides))


def test_fixed_reward_moments_from_a_file(tmp_path):
  path = tmp_path / "stats.json"
  path.write_text(json.dumps({"mean": 1.5, "std": 0.25}))
  s = settings.read(_config(**{"reward.normalize": "fixed", "reward.stats_path": str(path)}))
  assert (s.reward_mean, s.reward_std) == (1.5, 0.25)
  path.write_text("{}")
  with pytest.raises(ConfigError, match="'mean' and 'std'"):
    settings.read(_config(**{"reward.normalize": "fixed", "reward.stats_path": str(path)}))
