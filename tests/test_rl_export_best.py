"""RL's export and evaluation: with `train.export_best` the best greedy evaluation's
iteration is exported (iteration 0, the starting policy, a candidate too), its checkpoint
kept through pruning and across a resume; the greedy evaluation reports what its scorer
calls for (an attribute model's steering distance, a judge's parse failures), the names
`train.export_best` is checked against. The mechanism on the shared loop:
tests/test_export_best.py.
"""

import types

import numpy as np
import pytest
from test_export_best import (
  _assert_same,
  _checkpoints,
  _differ,
  _evals,
  _expected_best,
  _hf_params,
  _saved_params,
)
from test_rl_task import _config as rl_config

from helpsteer_jax.configs import rl as rl_configs
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.inference.steering import Request
from helpsteer_jax.judges import genrm, principle
from helpsteer_jax.rl import evaluation
from helpsteer_jax.rl.rollout import Prompt, Rollouts
from helpsteer_jax.scoring import rewards
from helpsteer_jax.tasks import rl as rl_task


def test_rl_exports_its_best_greedy_evaluation_and_a_resumed_run_keeps_it(tmp_path, capsys):
  """RL (GRPO on the brevity reward, which it learns), evaluated every iteration,
  exporting the iteration of the lowest greedy reward: an early one, the starting policy
  (iteration 0, saved for it) included; kept through pruning and across a resume."""
  work = tmp_path / "rl"

  def config(steps):
    return rl_config(algorithm="grpo", **{
        "train.num_steps": steps, "train.eval_every": 1, "train.export_hf": True,
        "train.keep_checkpoints": 1, "train.save_every": 100, "prompts.eval_limit": 4,
        "train.export_best": "reward", "train.export_best_mode": "min"})

  summary = rl_task.run(config(3), str(work))
  evals = _evals(work, "reward")
  best = _expected_best(evals, "min")
  assert sorted(evals) == [0, 1, 2, 3] and best != 3, evals
  assert summary["export"]["step"] == best and summary["export"]["value"] == evals[best]
  assert f"exported iteration {best}, the best eval reward (min)" in capsys.readouterr().out
  assert _checkpoints(work) == [best, 3]
  exported = _hf_params(work)
  _assert_same(exported, _saved_params(work, best))
  assert _differ(exported, _saved_params(work, 3)) > 1e-4

  summary = rl_task.run(config(5), str(work))
  evals = _evals(work, "reward")
  assert summary["export"]["step"] == _expected_best(evals, "min") == best
  assert _checkpoints(work) == [best, 5]
  _assert_same(_hf_params(work), _saved_params(work, best))


def _rollouts(texts):
  n = len(texts)
  return Rollouts(prompts=[[1]] * n, k=1, tokens=np.zeros((n, 4), np.int32),
                  mask=np.ones((n, 4), np.float32), sampler_logp=np.zeros((n, 4), np.float32),
                  finished=np.array([True] * (n - 1) + [False]), texts=list(texts))


def test_the_greedy_evaluation_reports_what_the_scorer_calls_for(tmp_path):
  """An attribute model's run: the steering distance where steering is requested; a
  judge's: the share of answers its verifier cannot parse, no steering distance. The
  names `reported` gives (what train.export_best is checked against) are those
  `evaluate` returns."""

  good = genrm.answer(genrm.Judgement((4, 2), 2))
  judged = {"genrm_verifier": ([good, "no boxes", good, good], 0.25),
            "principle_verifier": ([f"Fine. {principle.JUDGEMENT} Yes", "none", "none",
                                    f"{principle.JUDGEMENT} No"], 0.5)}
  preds = np.zeros((4, 9), np.float32)
  preds[:, ATTRIBUTES.index("verbosity")] = [1, 2, 3, 4]
  weights = rewards.weight_vector({"verbosity": 1.0})
  conv = Conversation("", (Turn("User", "q"),))

  def run(texts, judge, asked):
    prompts = [Prompt(Request("q", conv, dict(asked)), [1]) for _ in texts]
    steering_on = evaluation.steering_requested(0.0, prompts)
    out = evaluation.evaluate(
        types.SimpleNamespace(pad_id=0), prompts, None, weights, ("verbosity",), 4,
        tmp_path, 0, lambda *a, **k: (_rollouts(texts), preds, None), judge, steering_on)
    assert tuple(out) == evaluation.reported(judge, steering_on)
    assert out["reward"] == pytest.approx(2.5) and out["truncated"] == 0.25
    return out

  assert run(["a"] * 4, "", {"verbosity": 4})["steer_distance"] == pytest.approx(1.5)
  assert "steer_distance" not in run(["a"] * 4, "", {})
  section = rl_configs.get_config("genrm").scorer
  for judge, (texts, share) in judged.items():
    section.source = judge
    assert evaluation.judge_of(section) == judge
    out = run(texts, judge, {"verbosity": 4})  # the prompts' attributes do not matter
    assert out["parse_failures"] == share and "steer_distance" not in out
  section.judge = "genrm"  # a trained judge scoring a policy: not a judge in training
  assert evaluation.judge_of(section) == ""
