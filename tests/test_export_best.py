"""What a training run exports: with `train.export_best` the best evaluated step (its
checkpoint kept through `train.keep_checkpoints` pruning, and known to a resumed run from
the checkpoints' recorded metrics), else the last; settings that cannot work fail before
training; the summary says which step the export holds and why.

The runs evaluate every step and choose by a metric whose best is early (the eval loss's
maximum, the greedy reward's minimum while training raises it), so that the export is
provably not the last step's model.
"""

import json
import math
import types

import jax
import numpy as np
import pytest
from flax import nnx
from test_rl_task import _config as rl_config

from helpsteer_jax.configs import rl as rl_configs
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference.steering import Request
from helpsteer_jax.judges import genrm, principle
from helpsteer_jax.models import hf
from helpsteer_jax.rl import evaluation
from helpsteer_jax.rl.rollout import Prompt, Rollouts
from helpsteer_jax.scoring import rewards
from helpsteer_jax.tasks import acsft
from helpsteer_jax.tasks import rl as rl_task
from helpsteer_jax.train import checkpoint as ckpt_lib
from helpsteer_jax.train import run_loop

from task_configs import short_config
from train_utils import make_trainer, synthetic_features, tiny_config


def _evals(workdir, name):
  """{step: eval_<name>} from metrics.jsonl, the last row of a step winning."""
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r[f"eval_{name}"] for r in rows if f"eval_{name}" in r}


def _expected_best(evals, mode):
  """The best step of {step: value} as documented: the best value, the earliest on ties."""
  sign = 1 if mode == "max" else -1
  return max(evals, key=lambda s: (sign * evals[s], -s))


def _saved_params(workdir, step):
  ckpt = ckpt_lib.Checkpointer(workdir / "checkpoints", 1, 0, async_save=False)
  state = ckpt.manager.restore(step, args=ckpt_lib.ocp.args.Composite(
      state=ckpt_lib.ocp.args.StandardRestore()))["state"]
  ckpt.close()
  return state["params"]


def _hf_params(workdir):
  model = hf.load_hf_model(workdir / "hf")
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _assert_same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def _differ(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _checkpoints(workdir):
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def test_the_best_is_the_best_value_and_the_earliest_of_ties():
  m = ckpt_lib.BestMetric("loss", "min")
  assert m.best([(1, {"loss": 2.0}), (2, {"loss": 1.0}), (3, {"loss": 1.0}), (4, {})]) == \
      ckpt_lib.Best(2, "loss", 1.0, "min")
  up = ckpt_lib.BestMetric("reward", "max")
  assert up.best([(0, {"reward": math.nan}), (1, None), (2, {"reward": -3.0}),
                  (5, {"reward": -1.5})]).step == 5
  assert up.best([(1, None), (2, {"loss": 1.0}), (3, {"reward": math.nan})]) is None
  # Pruning keeps the latest `keep` and the best, whatever its age.
  infos = [types.SimpleNamespace(step=s, metrics=m) for s, m in
           [(1, {"loss": 3.0}), (2, {"loss": 0.5}), (3, {}), (4, {"loss": 1.0}), (5, {})]]
  kept = ckpt_lib._LatestAndBest(2, m).should_preserve(infos)
  assert [i.step for i, k in zip(infos, kept) if k] == [2, 4, 5]


def test_settings_that_cannot_work_fail_before_training(tmp_path):
  features = synthetic_features(16)
  for train, message in [({"export_best_mode": ""}, "export_best_mode=max or min"),
                         ({"export_best_mode": "up"}, "export_best_mode=max or min"),
                         ({"eval_every": 0}, "set train.eval_every")]:
    config = tiny_config(**{"export_best": "loss", "export_best_mode": "min",
                            "eval_every": 1, **train})
    with pytest.raises(ConfigError, match=message):
      run_loop.best_metric(config.train)
  config = tiny_config(export_best="accuracy", export_best_mode="max", eval_every=1)
  with pytest.raises(ConfigError, match=r"export_best='accuracy': this run's evaluation"
                                        r" reports loss; set one of them"):
    make_trainer(config, tmp_path / "unknown", features, features[:8])
  config.train.export_best = "loss"
  with pytest.raises(ConfigError, match="needs an evaluation, and this run has none"):
    make_trainer(config, tmp_path / "no_eval", features)
  assert not (tmp_path / "unknown" / "checkpoints").exists()


def test_acsft_exports_its_best_evaluated_step_and_a_resumed_run_keeps_it(tmp_path):
  """AC-SFT, evaluated every step, exporting the step of the highest eval loss (the
  first, as the loss falls): hf/ holds that checkpoint's weights, not the last's; the
  checkpoint outlives keep_checkpoints=1; the rerun to more steps still exports it, known
  from the checkpoints (metrics.jsonl removed before it)."""
  work = tmp_path / "acsft"

  def config(steps):
    return short_config("acsft", export=True, train={
        "num_steps": steps, "eval_every": 1, "eval_batches": 2, "keep_checkpoints": 1,
        "export_best": "loss", "export_best_mode": "max"})

  summary = acsft.run(config(4), str(work))
  evals = _evals(work, "loss")
  best = _expected_best(evals, "max")
  assert sorted(evals) == [1, 2, 3, 4] and best != 4, evals
  assert summary["export"] == {"step": best, "chosen_by": "best eval loss (max)",
                               "metric": "loss", "value": evals[best], "mode": "max"}
  assert _checkpoints(work) == [best, 4]
  exported = _hf_params(work)
  _assert_same(exported, _saved_params(work, best))
  assert _differ(exported, _saved_params(work, 4)) > 1e-4

  (work / "metrics.jsonl").unlink()  # the rerun reads the best from the checkpoints
  summary = acsft.run(config(6), str(work))
  assert summary["export"]["step"] == best and summary["export"]["value"] == evals[best]
  assert sorted(_evals(work, "loss")) == [5, 6]
  assert _checkpoints(work) == [best, 6]
  _assert_same(_hf_params(work), _saved_params(work, best))


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
