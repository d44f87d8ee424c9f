"""The rl task stopped and resumed: a run stopped after an iteration, or by a real SIGTERM
in the middle of one, resumes to the uninterrupted run's iterations (prompts, completions,
reward moments, the PPO critic and the weights).
"""

import json

import numpy as np
from test_rl_task import _config, _train_rows

from helpsteer_jax.tasks import rl as task
from helpsteer_jax.train import checkpoint as ckpt_lib

from conftest import REPO_ROOT


def _params(workdir, step=2):
  """The policy's params in a run's checkpoint of iteration `step`."""
  ckpt = ckpt_lib.Checkpointer(workdir / "checkpoints", 1, 2, async_save=False)
  state = ckpt.manager.restore(step, args=ckpt_lib.ocp.args.Composite(
      state=ckpt_lib.ocp.args.StandardRestore()))["state"]
  ckpt.close()
  return state["params"]


def assert_resumes(config, tmp_path, keys) -> None:
  """`config`'s run of 2 iterations, stopped after 1 and resumed: iteration 2's `keys`
  and the final weights equal the uninterrupted run's."""
  config.train.num_steps = 2
  task.run(config, str(tmp_path / "straight"))
  config.train.num_steps = 1
  task.run(config, str(tmp_path / "resumed"))
  config.train.num_steps = 2
  task.run(config, str(tmp_path / "resumed"))
  straight, resumed = _train_rows(tmp_path / "straight"), _train_rows(tmp_path / "resumed")
  for key in keys:
    assert straight[2][key] == resumed[2][key], key
  import jax
  for x, y in zip(jax.tree.leaves(_params(tmp_path / "straight")),
                  jax.tree.leaves(_params(tmp_path / "resumed"))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_resumed_run_repeats_the_uninterrupted_one(tmp_path):
  """Stopped after iteration 1 and resumed, iteration 2 is the uninterrupted run's: the
  same prompts, completions, reward moments and (PPO) critic."""
  assert_resumes(_config(algorithm="ppo", **{"prompts.eval_limit": 2}), tmp_path,
                 ("reward", "reward_normalized", "kl", "loss", "response_length",
                  "value_loss", "value"))


def test_sigterm_mid_run_saves_and_the_rerun_repeats_the_uninterrupted_run(tmp_path):
  """A real SIGTERM during iteration 2 of a process: it finishes that iteration, saves,
  exits with status preempted; the rerun's iterations equal an uninterrupted run's."""
  import os
  import signal
  import subprocess
  import sys
  import textwrap
  import time

  overrides = {"algorithm": "grpo", "train.num_steps": 3, "prompts.eval_limit": 2}
  task.run(_config(**overrides), str(tmp_path / "straight"))
  work = tmp_path / "stopped"
  code = textwrap.dedent(f"""
      from test_rl_task import _config
      from helpsteer_jax.tasks import rl
      rl.run(_config(**{overrides!r}), {str(work)!r})
      """)
  tests = REPO_ROOT / "tests"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(tests)]))
  proc = subprocess.Popen([sys.executable, "-c", code], cwd=tests, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 600
  while (proc.poll() is None and time.time() < deadline
         and not ((work / "metrics.jsonl").exists() and _train_rows(work))):
    time.sleep(0.2)
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  proc.send_signal(signal.SIGTERM)  # during iteration 2: iteration 1's row is written
  _, stderr = proc.communicate(timeout=600)
  assert proc.returncode == 0, stderr[-3000:]
  summary = json.loads((work / "summary.json").read_text())
  assert summary["status"] == "preempted" and summary["iteration"] == 2, summary
  assert not (work / "hf").exists()

  task.run(_config(**overrides), str(work))
  straight, resumed = _train_rows(tmp_path / "straight"), _train_rows(work)
  assert sorted(resumed) == [1, 2, 3]
  for step in (2, 3):
    for key in ("reward", "reward_normalized", "kl", "loss", "response_length"):
      assert straight[step][key] == resumed[step][key], (step, key)
