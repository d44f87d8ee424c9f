"""The checks before a run, from its config alone (so the same on every process): its
workdir (`--workdir`, else the config's `workdir`, else the task's default,
`task_configs.default_workdir`) and every key it was given read (`config_reads`: the
warnings to print, or a ConfigError). `main.py` runs them, and so does anything that
must start a command as `main.py` would (benchmarks/demo_figures.py)."""

from __future__ import annotations

import pathlib
from typing import Any, Iterable

from helpsteer_jax import config_reads, task_configs, tasks


def before_run(config: Any, spec: str, overrides: Iterable[str],
               workdir: str | None = None) -> tuple[str, list[str]]:
  """(the workdir, the warnings) of `config`, loaded from `spec` (`path[:preset]`) with
  the command line's `overrides` (dotted keys); ConfigError for a key it will not read."""
  path, preset = task_configs.split_spec(task_configs.resolve(spec))
  from_file = pathlib.Path(path).is_file()
  workdir = workdir or config.get("workdir") or (
      task_configs.default_workdir(path, preset, config) if from_file
      else f"{task_configs.DEFAULT_WORKDIR}/{config.task}")
  if not from_file:
    return workdir, []
  given = task_configs.given_keys(path, preset, overrides)
  task = tasks.get_task(config.task)
  return workdir, config_reads.check(config, given, tasks.config_reads(task))
