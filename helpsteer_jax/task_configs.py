"""The task config files the package ships (`helpsteer_jax/configs/`), found by name.

`--config=acsft:llama2_70b` names a packaged config; a path (the repository's
`configs/acsft.py`, or a file of your own) is taken as given. Each packaged
file has `get_config(preset)` and `PRESETS`, its presets with the default first.
"""

from __future__ import annotations

import pathlib
import re
import runpy
import textwrap
from typing import Any, Iterable

from helpsteer_jax import choices, config_reads
from helpsteer_jax.errors import ConfigError

PACKAGED = pathlib.Path(__file__).resolve().with_name("configs")
DEFAULT_WORKDIR = "workdir"  # a task's outputs go to <DEFAULT_WORKDIR>/<task> by default
# The choices --help lists under a task: its config key and the names it takes.
TASK_CHOICES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "attribute_model": (("loss", choices.ATTRIBUTE_LOSSES),),
    "dpo2d": (("loss.loss_type", choices.PREFERENCE_LOSSES),),
    "iterative_dpo": (("loss.loss_type", choices.SEQUENCE_LOSSES),),
    "rl": (("algorithm", tuple(choices.RL_ALGORITHMS)),),
}


def split_spec(spec: str) -> tuple[str, str]:
  """`path[:preset]` -> (path, preset)."""
  path, _, preset = spec.partition(":")
  return path, preset


def resolve(spec: str) -> str:
  """`spec` with a packaged task's name replaced by its file's path."""
  path, preset = split_spec(spec)
  if pathlib.Path(path).exists() or "/" in path:
    return spec
  packaged = PACKAGED / (path if path.endswith(".py") else f"{path}.py")
  if not packaged.is_file():
    return spec  # absl's own message names the missing file
  return f"{packaged}:{preset}" if preset else str(packaged)


def load(path: str | pathlib.Path) -> dict[str, Any]:
  return runpy.run_path(str(path))


def _config(module: dict[str, Any], preset: str) -> Any:
  return module["get_config"](preset) if preset else module["get_config"]()


def _value(config: Any, key: str) -> Any:
  for part in key.split("."):
    config = config[part]
  return config


def default_workdir(path: str, preset: str, config: Any) -> str:
  """`<DEFAULT_WORKDIR>/<task>`, then `_<preset>` unless it is the default, then the
  value of each of the task file's `RUN_KEYS` that differs from the preset's own (rl's
  `algorithm`): runs of different recipes never share a default workdir."""
  module = load(path)
  presets = tuple(module.get("PRESETS", ()))
  parts = [str(config.task)]
  if preset and presets and preset != presets[0]:
    parts.append(preset)
  run_keys = tuple(module.get("RUN_KEYS", ()))
  if run_keys:
    own = _config(module, preset)
    parts += [str(_value(config, k)) for k in run_keys if _value(config, k) != _value(own, k)]
  return f"{DEFAULT_WORKDIR}/" + "_".join(re.sub(r"[^A-Za-z0-9._-]+", "-", p) for p in parts)


def given_keys(path: str, preset: str, overrides: Iterable[str]) -> dict[str, str]:
  """The keys a run was given (`config_reads.given_keys`): the command line's
  `overrides` and what `preset` sets apart from the task file's defaults."""
  module = load(path)
  return config_reads.given_keys(_config(module, preset), _config(module, "") if preset
                                 else None, overrides, preset)


def check_preset(spec: str) -> None:
  """Raises ConfigError naming the presets when `spec`'s preset is not one of them."""
  path, preset = split_spec(spec)
  if not preset or not pathlib.Path(path).is_file():
    return
  presets = load(path).get("PRESETS")
  if presets is not None and preset not in presets:
    raise ConfigError(f"unknown {pathlib.Path(path).stem} preset {preset!r} ({path}); choose"
                      f" one of {', '.join(presets)}")


def renamed_key(key: str, renamed: dict[str, str]) -> str | None:
  """What replaced `key` (a dotted config key) by a task file's `RENAMED` table: the new
  key (the rest of a moved section carried over), or a "removed: ..." reason; None if the
  key was not renamed."""
  for old in sorted(renamed, key=len, reverse=True):
    new = renamed[old]
    nested = new.startswith(old + ".")  # the old key is now a section: only it moved
    if key == old or (key.startswith(old + ".") and not nested):
      return new if new.startswith("removed:") else new + key[len(old):]
  return None


def check_renamed(spec: str, keys: list[str]) -> None:
  """ConfigError naming the new key of the first override in `keys` that a task renamed."""
  path, _ = split_spec(spec)
  if not keys or not pathlib.Path(path).is_file():
    return
  renamed = load(path).get("RENAMED") or {}
  for key in keys:
    new = renamed_key(key, renamed)
    if new is not None and new.startswith("removed:"):
      raise ConfigError(f"--config.{key} was removed ({new[len('removed:'):].strip()})")
    if new is not None:
      raise ConfigError(f"--config.{key} is now --config.{new}")


def packaged_tasks() -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
  """(task file name, its docstring's first paragraph, its presets, the tasks whose default
  output its default config reads) of every packaged config."""
  tasks = []
  names = {p.stem for p in PACKAGED.glob("*.py")}
  for path in sorted(PACKAGED.glob("*.py")):
    if path.name.startswith("_"):
      continue
    module = load(path)
    summary = " ".join((module.get("__doc__") or "").strip().split("\n\n")[0].split())
    needs = tuple(sorted(t for t in _default_outputs_read(module["get_config"]())
                         if t in names and t != path.stem))
    tasks.append((path.stem, summary, tuple(module.get("PRESETS", ())), needs))
  return tasks


def _default_outputs_read(config: Any) -> set[str]:
  """The tasks `workdir/<task>` names among a config's string values (its default inputs)."""
  found = set()
  for value in config.values():
    if hasattr(value, "values"):
      found |= _default_outputs_read(value)
    elif isinstance(value, str) and value.startswith(DEFAULT_WORKDIR + "/"):
      found.add(value[len(DEFAULT_WORKDIR) + 1:].split("/")[0])
  return found


def help_text(program: str) -> str:
  """What `--help` prints: usage, and the tasks with their presets."""
  lines = [
      f"usage: {program} --config=TASK[:PRESET] [--config.KEY=VALUE ...] [--workdir=DIR]",
      "",
      "TASK is one of the tasks below or the path of a config file (configs/acsft.py);",
      "PRESET one of its presets (the first is the default). --config.KEY=VALUE overrides",
      "any field of the config; --helpfull lists every flag. A task writes its outputs to",
      f"--workdir, by default ./{DEFAULT_WORKDIR}/TASK, with _PRESET for a preset and _ALGORITHM",
      f"for another RL algorithm (./{DEFAULT_WORKDIR}/rl_dapo); rerunning a command resumes its",
      "run there, and a run with other settings is refused. \"after:\" names the tasks whose",
      "default outputs a task's defaults read (run those first, or point the task elsewhere).",
      "",
      "tasks:",
  ]
  indent = " " * 23
  for name, summary, presets, needs in packaged_tasks():
    lines += textwrap.wrap(summary, 100, initial_indent=f"  {name:<20} ",
                           subsequent_indent=indent)
    if presets:
      lines += textwrap.wrap("presets: " + ", ".join(presets), 100, initial_indent=indent,
                             subsequent_indent=indent + "  ")
    for key, names in TASK_CHOICES.get(name, ()):
      lines += textwrap.wrap(f"--config.{key}: " + ", ".join(names), 100,
                             initial_indent=indent, subsequent_indent=indent + "  ")
    if needs:
      lines.append(f"{indent}after: " + ", ".join(
          f"{t} (reads ./{DEFAULT_WORKDIR}/{t})" for t in needs))
  sources = ", ".join(f"{name} ({what})" for name, what in choices.SCORER_SOURCES.items())
  lines += ["", *textwrap.wrap(
      "A task with a scorer section takes --config.scorer.source: an attribute_model run or"
      " its HF export, a server's http://HOST:PORT/v1, package.module:function, or"
      f" {sources}; with --config.scorer.judge ({', '.join(choices.JUDGES)}) the source is"
      " a judge model's path or URL.", 100)]
  return "\n".join(lines)
