"""RL (GRPO, and on-policy distillation mixed with the reward) with two processes trains
as one process does.

The harness and what every two-process test checks: tests/task_groups.py.
"""

import json
import os

import numpy as np
import pytest

import task_groups as tg

pytestmark = pytest.mark.multihost


def _rl(task_inputs, workdir, *extra: str) -> tuple[str, ...]:
  """GRPO with a host-side scorer (split over the processes) and two updates per
  iteration."""
  return ("--config=configs/rl.py", *tg.MODEL, *tg.MESH, "--config.init.source=",
          f"--config.tokenizer={task_inputs['tokenizer']}",
          "--config.scorer.source=fake_scorer:make_brevity",
          "--config.prompts.demo_train_prompts=16", "--config.prompts.eval_limit=4",
          "--config.rollout.prompts_per_iteration=4", "--config.rollout.samples_per_prompt=4",
          "--config.rollout.max_new_tokens=12", "--config.train.num_steps=2",
          "--config.train.global_batch=8", "--config.train.micro_batch=8",
          "--config.train.seq_len=128", "--config.train.loss_chunk_size=64",
          "--config.train.export_hf=false", "--config.optimizer.lr=1e-2", f"--workdir={workdir}",
          *extra)


def _distill(task_inputs) -> tuple[str, ...]:
  """Distillation from the random HF backbone (MODEL's shape), the reward's term mixed in."""
  return ("--config.algorithm=distill", f"--config.teacher.source={task_inputs['backbone']}",
          "--config.loss.reward_coef=0.5")


RL_EXACT = ("step", "reward", "reward_normalized", "reward_std", "score", "response_length",
            "truncated", "learning_rate")
RL_TIMINGS = ("time", "rollout_tokens_per_s", "update_tokens_per_s", "rollout_s", "score_s",
              "update_s", "iteration_s")


@pytest.mark.parametrize("distill", [False, True], ids=["grpo", "distill"])
def test_rl_two_processes_train_as_one(task_inputs, tmp_path, distill):
  """Rollouts, rewards, advantages and updates with two processes equal one process's:
  the same samples and rewards (the eval samples byte for byte), and losses and weights
  equal up to the order of the gradient all-reduce across processes (as the SFT loop's,
  tests/test_multihost.py)."""
  extra = _distill(task_inputs) if distill else ()
  tg.single(*_rl(task_inputs, tmp_path / "single", *extra))
  run, _ = tg.run_two(tmp_path, *_rl(task_inputs, tmp_path / "w", *extra))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "samples/iteration_000000.jsonl",
                 "samples/iteration_000002.jsonl")

  def metrics(workdir):
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in RL_TIMINGS} for r in rows]

  one, two = metrics(tmp_path / "single"), metrics(tmp_path / "w")
  assert [sorted(r) for r in one] == [sorted(r) for r in two] and len(one) == 4
  assert ("teacher_kl" in one[1]) == distill
  for a, b in zip(one, two):
    for key in a:
      if key in RL_EXACT or key.startswith("eval_"):
        assert a[key] == b[key], (a["step"], key)
      else:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=key)
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


def test_dapo_rounds_and_the_sampler_correction_are_the_same_on_two_processes(
    task_inputs, tmp_path):
  """DAPO's dynamic sampling (a pass/fail reward, so that groups are dropped and
  further rounds sampled) and the sampler correction of bf16 rollouts decide the same
  on two processes as on one: the same rounds, drop rates, rewards and eval samples."""
  def args(workdir):
    base = [a for a in _rl(task_inputs, workdir) if not a.startswith("--config.scorer.source")]
    return (*base, "--config.algorithm=dapo", "--config.scorer.source=fake_scorer:make_binary",
            "--config.loss.dynamic_sampling_rounds=2", "--config.rollout.dtype=bfloat16",
            "--config.loss.sampler_correction=token_truncate")

  tg.single(*args(tmp_path / "single"))
  tg.run_two(tmp_path, *args(tmp_path / "w"))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "samples/iteration_000002.jsonl")
  one, two = (tg_rows(tmp_path / name) for name in ("single", "w"))
  assert len(one) == len(two) == 2
  for a, b in zip(one, two):
    for key in ("reward", "response_length", "dynamic_rounds", "dynamic_drop_rate",
                "dynamic_filled"):
      assert a[key] == b[key], key
    for key in ("mismatch_kl_k3", "is_weight_mean", "loss"):
      np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6, err_msg=key)


def test_off_policy_rollouts_are_the_same_on_two_processes(task_inputs, tmp_path):
  """`rollout.max_staleness=1`: each process gives half its devices to rollouts (the
  training mesh 2 x 2, the rollout mesh 4-way data parallel, both spanning the processes);
  the rollouts sampled ahead, their rewards and behaviour log-probs, and the updates on
  them are the same as one process's."""
  def args(workdir):
    base = [a for a in _rl(task_inputs, workdir) if not a.startswith("--config.mesh.fsdp")]
    return (*base, "--config.mesh.fsdp=2", "--config.rollout.max_staleness=1",
            "--config.train.num_steps=3")

  tg.single(*args(tmp_path / "single"))
  tg.run_two(tmp_path, *args(tmp_path / "w"))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "samples/iteration_000003.jsonl")
  one, two = (tg_rows(tmp_path / name, "staleness") for name in ("single", "w"))
  assert [r["staleness"] for r in one] == [r["staleness"] for r in two] == [0.0, 1.0, 1.0]
  for a, b in zip(one, two):
    for key in ("reward", "response_length", "truncated"):
      assert a[key] == b[key], key
    for key in ("loss", "kl", "clip_fraction", "grad_norm"):
      np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6, err_msg=key)


def tg_rows(workdir, key="dynamic_rounds"):
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [r for r in rows if key in r]


def test_multi_turn_rollouts_are_the_same_on_two_processes(task_inputs, tmp_path):
  """`rollout.multi_turn`: every process continues the same conversations (the follow-up
  turns' seeds and rows), scores each answer the same way, and trains as one process."""
  path = tmp_path / "turns.jsonl"
  path.write_text("".join(json.dumps({"turns": [f"Name colour {i}.", "Another?", "Why?"]
                                               [: 1 + i % 3]}) + "\n" for i in range(8)))

  def args(workdir):
    return _rl(task_inputs, workdir, "--config.rollout.multi_turn=true",
               "--config.rollout.multi_turn_reward=each", f"--config.prompts.train_path={path}",
               f"--config.prompts.eval_path={path}")

  tg.single(*args(tmp_path / "single"))
  tg.run_two(tmp_path, *args(tmp_path / "w"))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "samples/iteration_000002.jsonl")
  one, two = (tg_rows(tmp_path / name, "turns") for name in ("single", "w"))
  assert len(one) == len(two) == 2
  for a, b in zip(one, two):
    for key in ("reward", "response_length", "truncated", "turns"):
      assert a[key] == b[key], key
    for key in ("loss", "kl", "grad_norm"):
      np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6, err_msg=key)
