"""A GenRM trained by GRPO with the verifier reward: two processes train as one process
does. HelpSteer3 rows (preference and feedback) become judge prompts on every process,
each answer is checked against its prompt's reference by the `genrm_verifier` scorer
(each process its share), and the samples, rewards and metrics equal the one-process
run's. A random policy does not answer in the judge's format, so every reward is the
verifier's parse failure: the test checks the path and its agreement, not learning
(the demo in docs/tasks/genrm.md shows the reward rising). Both export the best greedy
evaluation (`train.export_best`: all tie, so iteration 0, the starting policy, restored
from its checkpoint by both processes) and report the same parse failures.

The harness: tests/task_groups.py.
"""

import json

import pytest

from helpsteer_jax.data.demo import helpsteer3 as demo_helpsteer3

import task_groups as tg

pytestmark = pytest.mark.multihost

EXACT = ("step", "reward", "reward_normalized", "reward_std", "score", "response_length",
         "truncated", "learning_rate")
TIMINGS = ("time", "rollout_tokens_per_s", "update_tokens_per_s", "rollout_s", "score_s",
           "update_s", "iteration_s")


def _args(task_inputs, data, workdir) -> tuple[str, ...]:
  base = tg.rl_args(task_inputs, workdir, "--config.scorer.source=genrm_verifier",
                    "--config.prompts.format=genrm", f"--config.prompts.train_path={data}",
                    "--config.prompts.genrm_guidelines=false", "--config.reward.normalize=none",
                    "--config.train.seq_len=448", "--config.rollout.max_new_tokens=16",
                    "--config.scorer.weights.helpfulness=1",
                    "--config.scorer.weights.correctness=0",
                    "--config.scorer.weights.coherence=0", "--config.train.eval_every=1",
                    "--config.train.export_best=reward", "--config.train.export_best_mode=max",
                    "--config.train.keep_checkpoints=1", "--config.train.export_dtype=float32")
  return tuple(a for a in base if not a.startswith(("--config.scorer.source=fake",
                                                    "--config.train.export_hf=")))


def test_genrm_rl_two_processes_train_as_one(task_inputs, tmp_path):
  data = demo_helpsteer3.write_demo_helpsteer3(tmp_path / "hs3", 24, 8)
  tg.single(*_args(task_inputs, data, tmp_path / "single"))
  tg.run_two(tmp_path, *_args(task_inputs, data, tmp_path / "w"))
  tg.assert_same(tmp_path / "single", tmp_path / "w", "samples/iteration_000000.jsonl",
                 "samples/iteration_000002.jsonl")
  samples = [json.loads(line) for line in
             (tmp_path / "w" / "samples" / "iteration_000002.jsonl").read_text().splitlines()]
  assert samples and all(s["reward"] == -100.0 and s["reference"]["ranking"] in range(1, 7)
                         for s in samples)

  def metrics(workdir):
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]

  one, two = metrics(tmp_path / "single"), metrics(tmp_path / "w")
  assert [sorted(r) for r in one] == [sorted(r) for r in two]
  assert [r["reward"] for r in two if "reward" in r] == [-100.0, -100.0]
  tg.assert_same_metrics(one, two, EXACT + ("parse_failures", "eval_parse_failures"))
  assert [r["eval_parse_failures"] for r in two if "eval_reward" in r] == [1.0, 1.0, 1.0]
  summaries = [json.loads((tmp_path / w / "summary.json").read_text()) for w in ("single", "w")]
  assert summaries[0]["export"] == summaries[1]["export"] == {
      "step": 0, "chosen_by": "best eval reward (max)", "metric": "reward", "value": -100.0,
      "mode": "max"}
  for w in ("single", "w"):
    assert sorted(p.name for p in (tmp_path / w / "checkpoints").iterdir()
                  if p.name.isdigit()) == ["0", "2"]
    assert (tmp_path / w / "hf" / "config.json").is_file()
