"""What a training run exports: with `train.export_best` the best evaluated step (its
checkpoint kept through `train.keep_checkpoints` pruning, and known to a resumed run from
the checkpoints' recorded metrics), else the last; settings that cannot work fail before
training; the summary says which step the export holds and why.

The run evaluates every step and chooses by a metric whose best is early (the eval
loss's maximum, as the loss falls), so that the export is provably not the last step's
model. RL's: tests/test_rl_export_best.py.
"""

import json
import math
import types

import jax
import numpy as np
import pytest
from flax import nnx

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import hf
from helpsteer_jax.tasks import acsft
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
  with pytest.raises(ConfigError, match="needs an evaluation, and this run has none: set"
                                        " data.validation_path"):
    make_trainer(config, tmp_path / "no_eval", features)
  assert not (tmp_path / "unknown" / "checkpoints").exists()


@pytest.mark.version_tier  # Orbax's metrics item and preservation policy
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
