"""Renamed config keys: an old key fails before anything loads, naming its new key."""

import pytest

from helpsteer_jax import config_base, task_configs

from conftest import REPO_ROOT


def _configs_with_renamed_keys():
  cases = []
  for name, *_ in task_configs.packaged_tasks():
    path = REPO_ROOT / "configs" / f"{name}.py"
    for old in task_configs.load(path).get("RENAMED", {}):
      cases.append((name, old))
  return cases


@pytest.mark.parametrize("task,old", _configs_with_renamed_keys())
def test_an_old_key_fails_before_anything_loads_naming_the_new_one(task, old, capsys):
  from helpsteer_jax import main
  renamed = task_configs.load(REPO_ROOT / "configs" / f"{task}.py")["RENAMED"]
  key = old if renamed[old].startswith((old + ".", "removed:")) else f"{old}.x"
  with pytest.raises(SystemExit) as exit_info:
    main._parse_flags(["helpsteer-jax", f"--config={task}", f"--config.{key}=1"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"error: --config.{key} ")
  new = task_configs.renamed_key(key, renamed)
  assert ("was removed" in err[0]) if new.startswith("removed:") else (
      err[0].endswith(f"is now --config.{new}"))


def test_renamed_keys_map_sections_and_leave_new_keys_alone():
  table = {"reward": "scorer", "reward.pad_multiple": "removed: buckets", "scorer": "scorer.source"}
  assert task_configs.renamed_key("reward.model.dtype", table) == "scorer.model.dtype"
  assert task_configs.renamed_key("reward.pad_multiple", table) == "removed: buckets"
  assert task_configs.renamed_key("scorer", table) == "scorer.source"
  assert task_configs.renamed_key("scorer.source", table) is None
  assert task_configs.renamed_key("scorer.batch_size", table) is None


def _default_config(task: str):
  return task_configs.load(REPO_ROOT / "configs" / f"{task}.py")["get_config"]()


@pytest.mark.parametrize("task,old", _configs_with_renamed_keys())
def test_the_new_key_exists_and_the_old_one_does_not(task, old):
  config = _default_config(task)
  new = task_configs.renamed_key(old, task_configs.load(
      REPO_ROOT / "configs" / f"{task}.py")["RENAMED"])
  flat = set(_flat_keys(config))
  if not new.startswith("removed:"):
    assert new in flat or any(k.startswith(new + ".") for k in flat), (task, old, new)
  assert old not in flat or new.startswith(old + "."), (task, old)


def _flat_keys(config, prefix=""):
  for key, value in config.items():
    yield prefix + key
    if hasattr(value, "items"):
      yield from _flat_keys(value, f"{prefix}{key}.")


# Tasks that read two models name them in their own section (expo: expo.base and
# expo.tuned; `model.*` is the family both share).
TWO_MODEL_TASKS = {"expo"}


def test_every_task_with_a_model_names_its_weights_in_config_init_and_its_model_by_name():
  for name, *_ in task_configs.packaged_tasks():
    config = _default_config(name)
    if "model" not in config or name in TWO_MODEL_TASKS:
      continue
    assert set(config_base.MODEL_RENAMED.values()) <= set(_flat_keys(config)), name
    assert {"init.source", "init.step"} <= set(_flat_keys(config)), name
    assert not {"init.hf_path", "init.checkpoint"} & set(_flat_keys(config)), name
    assert "model.name" in set(_flat_keys(config)) and "preset" not in config.model, name
    renamed = task_configs.load(REPO_ROOT / "configs" / f"{name}.py")["RENAMED"]
    assert config_base.MODEL_RENAMED.items() <= renamed.items(), name
