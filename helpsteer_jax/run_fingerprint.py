"""A run's fingerprint: the settings that define it, recorded in its workdir, so that a
rerun in the same workdir resumes that run and no other.

The fingerprint is every setting of the config except those that do not change what
the run computes (`NOT_DEFINING`): counts that may grow (`train.num_steps`), where
and how often outputs are written, how the work is laid out over devices and
processes (a run may resume on another slice), and the escapes themselves. The first
run writes it to `<workdir>/run_settings.json` before anything else; a rerun compares
before anything is loaded or written. Different settings are refused, naming each
key that differs with its old and new value, unless every one of them is named in
`allow_changed` (the fingerprint is then rewritten, the change kept in its
`history`). A workdir that holds nothing but the fingerprint (a run that stopped
before writing anything) takes the new one. Process 0 decides; every process gets
the same decision.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from absl import logging

from helpsteer_jax import multihost, processes
from helpsteer_jax.config_reads import covers, leaves
from helpsteer_jax.errors import ConfigError

FILE = "run_settings.json"
ALLOW_KEY = "allow_changed"
SHOWN = 8  # differing keys named in the error (the rest counted)
# Entries of a workdir that are not a run's work.
NOT_WORK = (FILE, FILE + ".tmp", "compile_cache")
NOT_DEFINING = (
    "workdir", "train.num_steps", "iterations", "train.log_every", "train.eval_every",
    "train.eval_batches", "train.save_every", "train.keep_checkpoints",
    "train.async_checkpoint", "train.peak_flops", "train.cpu_peak_gflops", "train.export_hf",
    "train.export_merged", "train.export_dtype", "train.export_best", "train.export_best_mode",
    "train.max_consecutive_nonfinite",
    "train.micro_batch", "train.loss_chunk_size", "model.remat_policy", "model.scan_layers",
    "model.attention_impl", "model.attention_block_size", "mesh", "sharding_rules",
    "rollout.mesh", "rollout.devices", "rollout.max_batch", "sampling.max_batch",
    "scorer.batch_size", "eval.batch_size", "reference.cache_dir", "reference.batch",
    "judge.parallel", "judge.timeout", "judge.max_retries", "judge.api_key_env",
    "distributed", "compile_cache", "compile_only", "compile_topology", "compile_slices",
    "compile_flops", "require_weights", ALLOW_KEY, "allow_unread")


def fingerprint(config: Any) -> dict[str, Any]:
  """{dotted key: JSON value} of the settings that define the run."""
  settings = {k: v for k, v in leaves(config)
              if not any(covers(p, k) for p in NOT_DEFINING)}
  return json.loads(json.dumps(settings, default=str))


def differences(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple]:
  """{key: (then, now)} of the keys both hold with different values (a key one of them
  lacks came or went with a version of the package, not with the run)."""
  return {k: (saved[k], current[k]) for k in sorted(set(saved) & set(current))
          if saved[k] != current[k]}


def _holds_work(workdir: pathlib.Path) -> bool:
  return any(p.name not in NOT_WORK and not p.name.startswith(".")
             for p in workdir.iterdir())


def _allowed(config: Any) -> tuple[str, ...]:
  raw = str(config.get(ALLOW_KEY, "") or "")
  return tuple(k.strip() for k in raw.split(",") if k.strip())


def _decide(config: Any, workdir: pathlib.Path, current: dict) -> dict:
  path = workdir / FILE
  if not path.is_file():
    return {"write": True, "changed": {}}
  try:
    saved = json.loads(path.read_text())
    saved_settings = saved["settings"]
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"{path} is not a run fingerprint ({type(e).__name__}: {e}): remove"
                      " it, or choose another --workdir") from None
  changed = differences(saved_settings, current)
  if saved.get("task") != config.task:
    changed = {"task": (saved.get("task"), config.task), **changed}
  if not changed:
    return {"write": False, "changed": {}}
  if not _holds_work(workdir):
    return {"write": True, "changed": {}}
  allowed = _allowed(config)
  refused = [k for k in changed if k == "task" or not any(covers(a, k) for a in allowed)]
  if refused:
    shown = "; ".join(f"{k}: {changed[k][0]!r} then, {changed[k][1]!r} now"
                      for k in refused[:SHOWN])
    more = f"; and {len(refused) - SHOWN} more" if len(refused) > SHOWN else ""
    raise ConfigError(
        f"{workdir} holds a run with other settings ({shown}{more}): a rerun there resumes"
        f" that run. Use another --workdir, or add --config.{ALLOW_KEY}={','.join(refused)}"
        " to continue it with these settings")
  return {"write": True, "changed": {k: list(v) for k, v in changed.items()},
          "history": saved.get("history", [])}


class Recorded:
  """What `check_or_record` wrote on this process, undone by `undo_unused` when the run
  stopped before writing anything else (a config or data error: nothing is left)."""

  def __init__(self, workdir: pathlib.Path, made_dir: bool, previous: str | None):
    self.workdir, self.made_dir, self.previous = workdir, made_dir, previous

  def undo_unused(self) -> None:
    if _holds_work(self.workdir):
      return
    path = self.workdir / FILE
    if self.previous is not None:
      path.write_text(self.previous)
      return
    path.unlink(missing_ok=True)
    if self.made_dir and not any(self.workdir.iterdir()):
      self.workdir.rmdir()


def _write(config: Any, workdir: pathlib.Path, current: dict, outcome: dict) -> dict:
  """Writes the record (process 0); what `Recorded` needs to undo it."""
  history = outcome.get("history", [])
  if outcome["changed"]:
    history = history + [{"changed": outcome["changed"]}]
  made_dir = not workdir.is_dir()
  path = workdir / FILE
  try:
    workdir.mkdir(parents=True, exist_ok=True)
    previous = path.read_text() if path.is_file() else None
    tmp = workdir / (FILE + ".tmp")
    tmp.write_text(json.dumps({"task": config.task, "settings": current, "history": history},
                              indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
  except OSError as e:
    raise ConfigError(f"cannot write to the workdir {workdir}: {e}; choose another --workdir"
                      " or free some space") from None
  return {**outcome, "made_dir": made_dir, "previous": previous}


def check_or_record(config: Any, workdir: str | pathlib.Path) -> Recorded | None:
  """Refuses a workdir whose run has other settings (ConfigError, on every process);
  otherwise records this run's fingerprint there (process 0: what it wrote, else None)."""
  workdir = pathlib.Path(workdir)
  current = fingerprint(config)

  def decide() -> dict:
    outcome = (_decide(config, workdir, current) if workdir.is_dir()
               else {"write": True, "changed": {}})
    return _write(config, workdir, current, outcome) if outcome["write"] else outcome

  outcome = multihost.on_primary(decide)
  if outcome["changed"]:
    logging.warning("%s: continuing the run with changed settings (%s): %s", workdir,
                    ALLOW_KEY, "; ".join(f"{k}: {a!r} -> {b!r}"
                                         for k, (a, b) in outcome["changed"].items()))
  if not (outcome["write"] and processes.is_primary()):
    return None
  return Recorded(workdir, outcome["made_dir"], outcome["previous"])
