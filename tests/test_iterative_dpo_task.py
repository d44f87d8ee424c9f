"""The iterative_dpo task end to end on a tiny policy: each round's pairs are its own
samples' best and worst by the attribute model's weighted reward (ties dropped), DPO
trains from the last round's weights with that round's policy as the reference, a run
resumed after a round (or inside a sampling file) writes the same files, the greedy
reward is reported per round, and settings DPO cannot use fail before loading.

The attribute model is `fake_scorer.make_brevity` (helpfulness 4 for an empty answer,
falling with its length), which a random policy can follow within a round.
"""

import json

import numpy as np
import pytest

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.tasks import iterative_dpo as task

from train_utils import task_config_overrides, tiny_policy_config


def _config(**overrides):
  config = tiny_policy_config("iterative_dpo")
  config.scorer.source = "fake_scorer:make_brevity"
  config.scorer.weights.update(helpfulness=1.0, correctness=0.0, coherence=0.0,
                               complexity=0.0, verbosity=0.0)
  config.prompts.update(demo_train_prompts=12, per_iteration=8, eval_limit=4)
  config.sampling.update(responses=3, max_new_tokens=12, batch_prompts=4)
  config.reference.batch = 4
  config.train.update(num_steps=3, global_batch=4, micro_batch=4, seq_len=96, log_every=1,
                      save_every=3, export_hf=False, loss_chunk_size=32, async_checkpoint=False)
  config.optimizer.update(lr=3e-2, warmup_steps=0)
  return task_config_overrides(config, overrides)


def _lines(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def test_rounds_pair_best_and_worst_train_dpo_and_resume_to_the_same_files(tmp_path):
  full = tmp_path / "full"
  summary = task.run(_config(), str(full))
  assert summary["status"] == "finished"
  rewards = summary["eval_reward"]
  assert set(rewards) == {0, 1, 2} and all(np.isfinite(v) for v in rewards.values())
  assert "| 2 |" in summary["table"]

  for r in (1, 2):
    rdir = full / f"iteration_{r}"
    samples, pairs = _lines(rdir / "samples.jsonl"), _lines(rdir / "pairs.jsonl")
    assert len(samples) == 8 and all(len(s["candidates"]) == 3 for s in samples)
    want = []
    for s in samples:
      got = [c["reward"] for c in s["candidates"]]
      if max(got) > min(got):
        want.append((s["prompt"], s["candidates"][int(np.argmax(got))]["response"],
                     s["candidates"][int(np.argmin(got))]["response"]))
    assert [(p["prompt"], p["chosen"], p["rejected"]) for p in pairs] == want
    assert all(p["chosen_reward"] > p["rejected_reward"] for p in pairs)
    dpo = json.loads((rdir / "summary.json").read_text())
    assert dpo["status"] == "finished" and dpo["pairs"]["train"] == len(pairs)
    # The reference is the round's starting policy: DPO's first step has zero margin.
    first = next(json.loads(line) for line in (rdir / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line).get("step") == 1)
    assert abs(first["reward_margin"]) < 1e-4, first

  resumed = tmp_path / "resumed"
  task.run(_config(iterations=1), str(resumed))
  cut = resumed / "iteration_2"
  cut.mkdir()
  lines = (full / "iteration_2" / "samples.jsonl").read_text().splitlines(keepends=True)
  (cut / "samples.jsonl").write_text("".join(lines[:4]))
  again = task.run(_config(), str(resumed))
  for name in ("samples.jsonl", "pairs.jsonl"):
    assert (full / "iteration_2" / name).read_text() == (cut / name).read_text(), name
  assert again["eval_reward"] == pytest.approx(summary["eval_reward"], abs=1e-6)


@pytest.mark.parametrize("key, value, match", [
    ("sampling.responses", 1, "at least 2"),
    ("loss.loss_type", "dpo2d", "segment"),
    ("sampling.temperature", 0.0, "temperature"),
    ("prompts.system", "Be terse.", "default system"),
])
def test_bad_settings_fail_before_loading(tmp_path, key, value, match):
  with pytest.raises(ConfigError, match=match):
    task.run(_config(**{key: value}), str(tmp_path))
