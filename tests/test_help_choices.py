"""`--help` and the README list each task's choices from the tables the code reads
(`helpsteer_jax/choices.py`), so that neither can go stale."""

import re

from helpsteer_jax import choices, task_configs
from helpsteer_jax.losses import bt, dpo2d
from helpsteer_jax.rl import algorithms
from helpsteer_jax.scoring import genrm, load, principle_verifier, rules
from helpsteer_jax.tasks import attribute_model, iterative_dpo

from conftest import REPO_ROOT

HELP = " ".join(task_configs.help_text("helpsteer-jax").split())  # wrapped lines joined


def _config(task: str):
  return task_configs.load(task_configs.PACKAGED / f"{task}.py")["get_config"]()


def _value(config, key: str):
  for part in key.split("."):
    config = config[part]
  return config


def test_the_registries_and_checks_read_the_tables_help_lists():
  assert list(algorithms.REGISTRY) == list(choices.RL_ALGORITHMS)
  assert dpo2d.LOSS_TYPES == choices.PREFERENCE_LOSSES
  assert iterative_dpo.SEQUENCE_LOSSES == choices.SEQUENCE_LOSSES
  assert attribute_model.LOSSES == choices.ATTRIBUTE_LOSSES
  assert bt.BT_VARIANTS == choices.ATTRIBUTE_LOSSES[1:]
  assert list(load.JUDGES) == list(load.JUDGE_KINDS) == list(choices.JUDGES)
  assert [rules.DEMO_RULES, genrm.VERIFIER, principle_verifier.VERIFIER] == list(
      choices.SCORER_SOURCES)


def test_help_lists_each_tasks_choices_under_the_task():
  tasks = [name for name, *_ in task_configs.packaged_tasks()]
  for task, listed in task_configs.TASK_CHOICES.items():
    config = _config(task)
    # The task's own block: from its name to the next task's.
    following = tasks[tasks.index(task) + 1:]
    block = HELP.split(f" {task} ", 1)[1]
    if following:
      block = block.split(f" {following[0]} ", 1)[0]
    for key, names in listed:
      assert _value(config, key) in names, (task, key)  # the key exists, its default listed
      assert f"--config.{key}: {', '.join(names)}" in block, (task, key, block)
  assert "--config.algorithm: rloo, grpo, ppo, gspo, dapo, distill" in HELP
  for name in (*choices.SCORER_SOURCES, *choices.JUDGES):
    assert name in HELP.split("A task with a scorer section", 1)[1], name


def test_the_readme_lists_each_choice_as_help_does():
  """The task's README section has one `- `key`: ...` line, naming the same choices."""
  sections = (REPO_ROOT / "README.md").read_text().split("\n### ")
  for task, listed in task_configs.TASK_CHOICES.items():
    [section] = [s for s in sections if s.split("\n", 1)[0].endswith(f"(`configs/{task}.py`)")]
    for key, names in listed:
      [line] = [x for x in section.splitlines() if x.startswith(f"- `{key}`: ")]
      named = re.findall(r"`(\w+)`", line[len(f"- `{key}`: "):].split(";")[0])
      assert sorted(named) == sorted(names), (task, key, line)


def test_the_rl_guides_name_every_algorithm():
  doc = (REPO_ROOT / "docs" / "tasks" / "rl.md").read_text()
  intro = doc.split("\n\n", 2)[1]
  summary = task_configs.load(task_configs.PACKAGED / "rl.py")["__doc__"].split("\n\n")[0]
  for name in choices.RL_ALGORITHMS:
    assert name.upper() in intro or f"`{name}`" in intro, name
    assert name.upper() in summary or f"`{name}`" in summary, name
