"""Which settings a run reads: a given key the run will not read is refused, and a given
setting that has no effect under the others is named in a warning at start.

A task declares its conditional settings as rules (`config_reads(config)` in its entry
module): `Reads`, keys read only under a condition on the other settings and who reads
them ("algorithm=gspo"), and `NoEffect`, a setting that is read but does nothing under
the others (a clip range when the ratio is always 1). A key no rule names is read by
every run of the task.

The keys checked are the ones the user gave: the command line's overrides and the
keys the preset sets apart from the task's defaults (`given_keys`). `check` runs
before anything is loaded and, as it reads only the config, decides the same on every
process. `allow_unread` (a comma-separated list of keys, or a section's name) lets
a run go on without keys it does not read, with a warning: the way out when a preset
sets a key for a setting the command line changed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

from helpsteer_jax.errors import ConfigError

ALLOW_KEY = "allow_unread"


@dataclasses.dataclass(frozen=True)
class Reads:
  """`keys` (dotted; a section's name covers every key in it) are read only when
  `when(config)`: when `setting` (the key that decides) is `values` (in words, e.g.
  "gspo", "rloo or ppo"). `problems(config)`: what is wrong with their values, checked
  even where they are not read. `harmless`: leaving them out changes no result (a batch
  size, the settings of a model that is not loaded), so a preset's value the command
  line's choice leaves unread is dropped with a warning; given on the command line, it
  is refused as any other."""
  keys: tuple[str, ...]
  setting: str
  values: str
  when: Callable[[Any], bool]
  problems: Callable[[Any], list[str]] = lambda config: []
  harmless: bool = False


@dataclasses.dataclass(frozen=True)
class NoEffect:
  """`why(config, given)`: why a setting has no effect under the run's other settings (a
  one-line warning), or None; `given` is the keys the user gave."""
  why: Callable[[Any, Mapping[str, str]], str | None]


Rule = Reads | NoEffect


def covers(pattern: str, key: str) -> bool:
  """Whether `pattern` (a dotted key or a section's name) names `key`."""
  return key == pattern or key.startswith(pattern + ".")


def leaves(node: Any, prefix: tuple[str, ...] = ()) -> Iterable[tuple[str, Any]]:
  """(dotted key, value) of every leaf of a ConfigDict (or dict)."""
  for name in node.keys():
    value = node[name]
    if hasattr(value, "keys"):
      yield from leaves(value, prefix + (name,))
    else:
      yield ".".join(prefix + (name,)), value


def given_keys(config: Any, defaults: Any, overrides: Iterable[str],
               preset: str = "") -> dict[str, str]:
  """{dotted key: where it was given}: each of the command line's `overrides`, and each
  key whose value in `config` (the preset's, before the overrides) differs from the
  task's `defaults`."""
  given = {}
  if preset and defaults is not None:
    default_values = dict(leaves(defaults))
    for key, value in leaves(config):
      if key not in default_values or default_values[key] != value:
        given[key] = f"preset {preset}"
  for key in overrides:
    given[key] = "the command line"
  return given


def _value(config: Any, key: str) -> Any:
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def _allowed(config: Any) -> tuple[str, ...]:
  raw = str(config.get(ALLOW_KEY, "") or "")
  return tuple(k.strip() for k in raw.split(",") if k.strip())


def check(config: Any, given: Mapping[str, str], rules: Iterable[Rule]) -> list[str]:
  """The warnings to print at start; ConfigError naming every given key the run will not
  read (who reads it) and every invalid value among the conditional keys."""
  rules = list(rules)
  reads = [r for r in rules if isinstance(r, Reads)]
  allowed = _allowed(config)
  unread, problems, warnings = [], [], []
  for rule in reads:
    if any(covers(k, g) for k in rule.keys for g in given):
      problems.extend(rule.problems(config))
  for key in sorted(given):
    if key == ALLOW_KEY:
      continue
    naming = [r for r in reads if any(covers(k, key) for k in r.keys)]
    if not naming or any(r.when(config) for r in naming):
      continue
    who = "; or ".join(dict.fromkeys(
        f"{r.setting} is {r.values} (this run: {r.setting}={_value(config, r.setting)!r})"
        for r in naming))
    line = f"{key}={_value(config, key)!r} (given by {given[key]}) is read only when {who}"
    escape = f"--config.{ALLOW_KEY}={key}"
    from_preset = given[key].startswith("preset")
    if any(covers(a, key) for a in allowed):
      warnings.append(f"{line}: the run goes on without it ({ALLOW_KEY})")
    elif from_preset and all(r.harmless for r in naming):
      warnings.append(f"{line}: the run goes on without it")
    elif from_preset:
      unread.append(f"{line}: add {escape} to run without it")
    else:
      unread.append(f"{line}: remove it, or add {escape} to run without it")
  unknown = [a for a in allowed if not any(covers(a, k) for k in given)]
  if unknown:
    problems.append(f"{ALLOW_KEY}={','.join(unknown)}: no such key was given")
  problems = unread + problems
  if problems:
    raise ConfigError("; ".join(dict.fromkeys(problems)))
  for rule in rules:
    if isinstance(rule, NoEffect):
      reason = rule.why(config, given)
      if reason:
        warnings.append(reason)
  return warnings


def any_given(given: Mapping[str, str], *keys: str) -> bool:
  """Whether one of `keys` (or a key in one of those sections) was given."""
  return any(covers(k, g) for k in keys for g in given)
