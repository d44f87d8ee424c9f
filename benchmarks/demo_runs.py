"""The demo figures' runs: what a demo is, how its commands run, and reading what they wrote.

A `Run` is a guide's commands as a user types them (`helpsteer-jax --config=...`, a
`VAR=value` prefix, `python -m ...`, shell), run in order in a fresh directory that holds
what a clone's root holds for them (`configs/`, the `data/` inputs named) and the
prerequisite runs' workdirs (`workdir/acsft`), so that every default workdir is fresh.
`helpsteer-jax` and `python` are this interpreter with this checkout's package first on
the path. Each command's wall time and peak RSS go to the run's `steps.json`, which
`Outputs` reads back with the files the tasks wrote.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, Mapping

from common import REPO

STEPS = "steps.json"  # a run's record of its commands
CLI = "helpsteer-jax"


@dataclasses.dataclass(frozen=True)
class Run:
  """Commands run in order in one fresh directory.

  `needs`: prerequisite runs whose workdir (`workdir/<name>`) is linked in;
  `inputs`: {path in the directory: path under the data directory}, a link each;
  `exports`: {VAR: command printing its value last}, run first, set for the commands
  (the guide writes `VAR=$(command)`); `requires`: why the run cannot run here, or None.
  """
  name: str
  commands: tuple[str, ...]
  needs: tuple[str, ...] = ()
  inputs: Mapping[str, str] = dataclasses.field(default_factory=dict)
  exports: Mapping[str, str] = dataclasses.field(default_factory=dict)
  requires: Callable[[], str | None] = lambda: None
  minutes: float = 5.0  # the estimate on a 2-core CPU

  def lines(self) -> list[str]:
    """What the guide shows: the exports as `VAR=$(command)`, then the commands."""
    return [f"{var}=$({cmd})" for var, cmd in self.exports.items()] + list(self.commands)


@dataclasses.dataclass(frozen=True)
class Table:
  """One marked table of a guide: `<!-- marker -->` ... `<!-- /marker -->`.

  `rows(outputs)` builds its rows from the runs' outputs; `timing` names the columns of
  wall times, written but not compared (they change with the machine's load)."""
  marker: str
  header: tuple[str, ...]
  rows: Callable[["Outputs"], list[list[str]]]
  timing: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Demo:
  """A guide's demo: its runs, the prerequisite runs its tables read besides them
  (`uses`), its tables, and images copied into docs/ ({doc path: path in a run})."""
  name: str
  doc: str
  runs: tuple[Run, ...]
  tables: tuple[Table, ...]
  uses: tuple[str, ...] = ()
  images: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)

  def prerequisites(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys(self.uses + tuple(n for r in self.runs for n in r.needs)))


# ------------------------------------------------------------------- the commands

def split_command(command: str) -> tuple[dict[str, str], list[str]]:
  """(the `VAR=value` prefixes, the argv) of a shell command line."""
  words = shlex.split(command)
  env = {}
  while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
    name, value = words.pop(0).split("=", 1)
    env[name] = value
  return env, words


@dataclasses.dataclass(frozen=True)
class Parsed:
  """A `helpsteer-jax` command as main.py reads it: its config, the workdir it writes,
  and the warnings its settings give."""
  config: Any
  workdir: str
  warnings: tuple[str, ...]


def parse_cli(command: str, values: Mapping[str, str] | None = None) -> Parsed | None:
  """The command's config with its overrides applied and main.py's checks before a run
  (the preset, renamed keys, every given key read); None for another program. `values`
  fill `$VAR`s. Raises what main.py reports (ConfigError, an absl flags error)."""
  from absl import flags
  from ml_collections import config_flags

  from helpsteer_jax import run_checks, task_configs

  _, argv = split_command(command)
  if not argv or argv[0] != CLI:
    return None
  argv = [os.path.expandvars(a) if values is None else _fill(a, values) for a in argv]
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      spec = arg.split("=", 1)[1]
      local = REPO / task_configs.split_spec(spec)[0]
      if not pathlib.Path(spec).is_absolute() and local.is_file():
        spec = str(REPO / spec)
      argv[i] = "--config=" + task_configs.resolve(spec)
      spec = argv[i].split("=", 1)[1]
  path, preset = task_configs.split_spec(spec)
  task_configs.check_preset(spec)
  task_configs.check_renamed(spec, [a[len("--config."):].split("=", 1)[0] for a in argv
                                    if a.startswith("--config.")])
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  flags.DEFINE_string("workdir", None, "", flag_values=fv)
  fv(argv)
  config = fv.config
  workdir, warnings = run_checks.before_run(
      config, spec, config_flags.get_override_values(fv["config"]), fv["workdir"].value)
  return Parsed(config, workdir, tuple(warnings))


def _fill(arg: str, values: Mapping[str, str]) -> str:
  for name, value in values.items():
    arg = arg.replace(f"${name}", value).replace(f"${{{name}}}", value)
  return arg


# ------------------------------------------------------------------- running a run

def _shims(root: pathlib.Path) -> pathlib.Path:
  """`helpsteer-jax` and `python` as this interpreter, in `root/bin`."""
  bin_dir = root / "bin"
  bin_dir.mkdir(parents=True, exist_ok=True)
  for name, target in ((CLI, f'"{sys.executable}" -m helpsteer_jax.main'),
                       ("python", f'"{sys.executable}"')):
    shim = bin_dir / name
    shim.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
    shim.chmod(0o755)
  return bin_dir


def environment(root: pathlib.Path) -> dict[str, str]:
  """A new user's shell on a CPU machine: no XLA flags or compile cache of ours, this
  checkout's package and the shims first."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR", "HELPSTEER_TEST_XLA_FLAGS")}
  env.update(JAX_PLATFORMS="cpu",
             PATH=f"{_shims(root)}{os.pathsep}{env.get('PATH', '')}",
             PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
  return env


def _link(link: pathlib.Path, target: pathlib.Path) -> None:
  link.parent.mkdir(parents=True, exist_ok=True)
  link.symlink_to(target.resolve())


def _step(command: str, cwd: pathlib.Path, env: dict[str, str], log: pathlib.Path) -> dict:
  """Runs `command` under bash in `cwd`: its exit status, wall seconds and peak RSS."""
  start = time.perf_counter()
  with open(log, "w") as out:
    proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=out,
                            stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
  proc.returncode = os.waitstatus_to_exitcode(status)
  return {"command": command, "status": proc.returncode,
          "wall_s": round(time.perf_counter() - start, 1),
          "peak_rss_gb": round(usage.ru_maxrss / 2**20, 2), "log": log.name}


def execute(run: Run, directory: pathlib.Path, root: pathlib.Path, data: pathlib.Path,
            prerequisites: Mapping[str, pathlib.Path], stamp: Mapping[str, Any]) -> dict:
  """Runs `run` in a fresh `directory`; its record (also written to `steps.json`):
  `stamp` (the machine, the commit), every step, and `error` naming the first that
  failed."""
  shutil.rmtree(directory, ignore_errors=True)
  directory.mkdir(parents=True)
  _link(directory / "configs", REPO / "configs")
  for need in run.needs:
    _link(directory / "workdir" / need, prerequisites[need] / "workdir" / need)
  for path, source in run.inputs.items():
    _link(directory / path, data / source)
  env = environment(root)
  record: dict[str, Any] = {"run": run.name, **stamp, "steps": []}
  jobs = [(cmd, var) for var, cmd in run.exports.items()] + [(c, None) for c in run.commands]
  for i, (command, var) in enumerate(jobs):
    print(f"[{run.name}] {command}", flush=True)
    step = _step(command, directory, env, directory / f"step_{i}.log")
    record["steps"].append(step)
    if step["status"]:
      record["error"] = f"exit status {step['status']}: {command} (see {directory / step['log']})"
      break
    if var:
      lines = (directory / step["log"]).read_text().strip().splitlines()
      env[var] = lines[-1] if lines else ""
  record["wall_s"] = round(sum(s["wall_s"] for s in record["steps"]), 1)
  (directory / STEPS).write_text(json.dumps(record, indent=2) + "\n")
  return record


# ------------------------------------------------------------------- reading the outputs

class Outputs:
  """The directories of a demo's runs (and the prerequisites it reads) and their files."""

  def __init__(self, dirs: Mapping[str, pathlib.Path], runs: Mapping[str, Run]):
    self.dirs, self.runs = dict(dirs), dict(runs)

  def record(self, run: str) -> dict:
    """The run's `steps.json`: its machine, commit and steps."""
    return json.loads((self.dirs[run] / STEPS).read_text())

  def wall(self, run: str) -> float:
    return float(self.record(run).get("wall_s", float("nan")))

  def workdir(self, run: str, command: int = -1) -> pathlib.Path:
    """The workdir the run's `command`-th `helpsteer-jax` command wrote (the last)."""
    clis = [c for c in self.runs[run].commands if split_command(c)[1][:1] == [CLI]]
    parsed = parse_cli(clis[command], {var: "" for var in self.runs[run].exports})
    return self.dirs[run] / parsed.workdir

  def json(self, run: str, name: str = "summary.json", command: int = -1) -> dict:
    return json.loads((self.workdir(run, command) / name).read_text())

  def metrics(self, run: str, command: int = -1) -> dict[int, dict]:
    """metrics.jsonl merged per step ({step: every scalar logged at it})."""
    out: dict[int, dict] = {}
    path = self.workdir(run, command) / "metrics.jsonl"
    for line in path.read_text().splitlines():
      record = json.loads(line)
      out.setdefault(record["step"], {}).update(record)
    return out

  def samples(self, run: str, iteration: int, command: int = -1) -> list[dict]:
    """An RL run's greedy answers of an evaluation (`samples/iteration_<N>.jsonl`)."""
    path = self.workdir(run, command) / "samples" / f"iteration_{iteration:06d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------- cells

def f(x: float | None, digits: int = 3) -> str:
  """A figure as the tables print it ("-" for none)."""
  return "-" if x is None or x != x else f"{x:.{digits}f}"


def duration(seconds: float) -> str:
  """`2 min 58 s`, `41 s`."""
  seconds = round(seconds)
  return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def distinct(responses: list[str]) -> str:
  """`33 (the most common 7 times)`: how many of the answers differ."""
  counts = collections.Counter(responses)
  return f"{len(counts)} (the most common {counts.most_common(1)[0][1]} times)"
