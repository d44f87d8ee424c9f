"""RL with two processes trains as one process does: on-policy distillation mixed with
GRPO's reward term, from one-step-off-policy rollouts. DAPO's rounds over multi-turn
rollouts: tests/test_multihost_rl_sampling.py.

The harness and what every two-process test checks: tests/task_groups.py.
"""

import json
import os

import numpy as np
import pytest

import task_groups as tg

pytestmark = pytest.mark.multihost


def _args(task_inputs, workdir) -> tuple[str, ...]:
  """Distillation from the random HF backbone (MODEL's shape), the reward's term mixed in.
  Each process gives half its devices to rollouts: the training mesh 2 x 2 (replacing
  MESH's fsdp), the rollout mesh 4-way data parallel, both spanning the processes; three
  iterations, so that two train on rollouts sampled ahead."""
  base = tg.rl_args(task_inputs, workdir, "--config.algorithm=distill",
                    f"--config.teacher.source={task_inputs['backbone']}",
                    "--config.loss.reward_coef=0.5", "--config.mesh.fsdp=2",
                    "--config.rollout.max_staleness=1", "--config.train.num_steps=3")
  return tuple(a for a in base if a != "--config.mesh.fsdp=4")


RL_EXACT = ("step", "reward", "reward_normalized", "reward_std", "score", "response_length",
            "truncated", "learning_rate")
RL_TIMINGS = ("time", "rollout_tokens_per_s", "update_tokens_per_s", "rollout_s", "score_s",
              "update_s", "iteration_s", "rollout_wait_s")


def test_rl_two_processes_train_as_one(task_inputs, tmp_path):
  """Rollouts, rewards, advantages and updates with two processes equal one process's:
  the same samples and rewards (the eval samples byte for byte), and losses and weights
  equal up to the order of the gradient all-reduce across processes (as the SFT loop's,
  tests/test_multihost.py); the rollouts sampled ahead, their rewards, behaviour
  log-probs and the teacher's too."""
  steps = 3
  tg.single(*_args(task_inputs, tmp_path / "single"))
  run, _ = tg.run_two(tmp_path, *_args(task_inputs, tmp_path / "w"))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "samples/iteration_000000.jsonl",
                 f"samples/iteration_{steps:06d}.jsonl")

  def metrics(workdir):
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in RL_TIMINGS} for r in rows]

  one, two = metrics(tmp_path / "single"), metrics(tmp_path / "w")
  assert [sorted(r) for r in one] == [sorted(r) for r in two] and len(one) == steps + 2
  assert "teacher_kl" in one[1]
  assert [r["staleness"] for r in two if "staleness" in r] == [0.0, 1.0, 1.0]
  assert max(r["clip_fraction"] for r in two if "clip_fraction" in r) > 0
  tg.assert_same_metrics(one, two, RL_EXACT)
  from helpsteer_jax import saved_params
  shapes, _ = saved_params.param_shapes(tmp_path / "single")
  import jax
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = {}
  for path, shape in shapes.items():
    node = target
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = jax.ShapeDtypeStruct(shape, np.float32, sharding=device)
  a, _ = saved_params.restore_params(tmp_path / "single", target)
  b, _ = saved_params.restore_params(tmp_path / "w", target)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    # Adam turns a rounding-level gradient difference into up to a fraction of lr.
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-5, atol=1e-4)
  assert {p.split(os.sep)[0] for p in run.written(1, tmp_path / "w")} <= {"checkpoints"}
