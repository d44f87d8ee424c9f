"""DAPO's rounds over multi-turn rollouts, with the sampler correction: two processes
decide and train as one process does (tests/test_multihost_rl.py: the loop itself).

The harness and what every two-process test checks: tests/task_groups.py.
"""

import json

import numpy as np
import pytest

import task_groups as tg

pytestmark = pytest.mark.multihost


def _one_and_two(tmp_path, args, key: str) -> tuple[list[dict], list[dict]]:
  """Runs `args(workdir)` on one process and on two; the same final eval samples; each
  run's iteration records (those holding `key`), two of them each."""
  tg.single(*args(tmp_path / "single"))
  tg.run_two(tmp_path, *args(tmp_path / "w"))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "samples/iteration_000002.jsonl")
  runs = []
  for name in ("single", "w"):
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    runs.append([r for r in map(json.loads, lines) if key in r])
  assert len(runs[0]) == len(runs[1]) == 2
  return runs[0], runs[1]


def test_dapo_multi_turn_with_the_sampler_correction_is_the_same_on_two_processes(
    task_inputs, tmp_path):
  """DAPO's dynamic sampling (a pass/fail reward on each answer, so that groups are
  dropped and further rounds sampled) over multi-turn conversations, from bf16 rollouts
  with the sampler correction: every process continues the same conversations (the
  follow-up turns' seeds and rows), takes the same rounds and drops, scores each answer
  the same way, and trains as one process."""
  path = tmp_path / "turns.jsonl"
  path.write_text("".join(json.dumps({"turns": [f"Name colour {i}.", "Another?", "Why?"]
                                               [: 1 + i % 3]}) + "\n" for i in range(8)))

  def args(workdir):
    base = [a for a in tg.rl_args(task_inputs, workdir, f"--config.prompts.train_path={path}",
                                  f"--config.prompts.eval_path={path}")
            if not a.startswith("--config.scorer.source")]
    return (*base, "--config.algorithm=dapo", "--config.scorer.source=fake_scorer:make_binary",
            "--config.loss.dynamic_sampling_rounds=2", "--config.rollout.dtype=bfloat16",
            "--config.loss.sampler_correction=token_truncate",
            "--config.rollout.multi_turn=true", "--config.rollout.multi_turn_reward=each")

  one, two = _one_and_two(tmp_path, args, "dynamic_rounds")
  assert any(r["turns"] > 1.0 for r in one)
  for a, b in zip(one, two):
    for key in ("reward", "response_length", "truncated", "turns", "dynamic_rounds",
                "dynamic_drop_rate", "dynamic_filled"):
      assert a[key] == b[key], key
    for key in ("mismatch_kl_k3", "is_weight_mean", "loss", "grad_norm"):
      np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6, err_msg=key)
