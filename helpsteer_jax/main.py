"""Command-line entry point (the `helpsteer-jax` command).

helpsteer-jax --config=<task>[:preset] [--config.key=value ...] [--workdir=DIR]
python -m helpsteer_jax.main --config=configs/<task>.py[:preset] ...  (the same)
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from helpsteer_jax import cpu_env, platforms, task_configs
from helpsteer_jax.errors import ConfigError, DataError, HelpsteerError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A task (acsft, dpo2d, ...) or a task config file, optionally with"
    " ':preset'.", lock_config=True)
_HELP = ("-h", "--help", "-help", "--h")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, logs and outputs"
    " (default: config.workdir, else ./workdir/<task>).")


def _fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr)
  jax = sys.modules.get("jax")
  if jax is not None and jax.distributed.is_initialized():
    # Every process fails alike; leaving without JAX's shutdown handshake
    # keeps one that exits first from aborting the others.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(2)
  sys.exit(2)


def _unknown_key_hint(argv: list[str]) -> str:
  """Names the first `--config.a.b` override whose key does not exist."""
  spec = _config_spec(argv)
  if spec is None:
    return ""
  path, preset = task_configs.split_spec(spec)
  try:
    module = task_configs.load(path)
    config = module["get_config"](preset) if preset else module["get_config"]()
  except Exception:  # the config file itself is broken: absl's message says why
    return ""
  for arg in argv:
    if not arg.startswith("--config."):
      continue
    keys = arg[len("--config."):].split("=", 1)[0].split(".")
    node = config
    for depth, key in enumerate(keys):
      if not hasattr(node, "keys") or key not in node:
        where = "config." + ".".join(keys[:depth]) if depth else "config"
        valid = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "(not a section)"
        close = _closest_key(config, keys)
        guess = f"did you mean {close!r}? " if close else ""
        return f"unknown key {'.'.join(keys)!r}: {guess}{where} has keys {valid}"
      node = node[key]
  return ""


def _closest_key(config, keys: list[str]) -> str:
  """The existing dotted key nearest to `keys` (a typo in any part), or ""."""
  import difflib

  def leaves(node, prefix=()):
    for k in node.keys():
      value = node[k]
      yield ".".join(prefix + (k,))
      if hasattr(value, "keys"):
        yield from leaves(value, prefix + (k,))

  found = difflib.get_close_matches(".".join(keys), list(leaves(config)), n=1, cutoff=0.8)
  return found[0] if found else ""


def _program(argv0: str) -> str:
  name = os.path.basename(argv0)
  return "python -m helpsteer_jax.main" if name in ("main.py", "__main__.py") else name


def _resolve_config(argv: list[str]) -> list[str]:
  """`--config=<task>[:preset]` (or `--config <task>`) as the packaged file's path."""
  argv = list(argv)
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      argv[i] = "--config=" + task_configs.resolve(arg.split("=", 1)[1])
      return argv
    if arg == "--config" and i + 1 < len(argv):
      argv[i + 1] = task_configs.resolve(argv[i + 1])
      return argv
  return argv


def _config_spec(argv: list[str]) -> str | None:
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.split("=", 1)[1]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing that turns config errors into one readable message."""
  if any(a in _HELP for a in argv[1:]):
    print(task_configs.help_text(_program(argv[0])))
    sys.exit(0)
  argv = _resolve_config(argv)
  spec = _config_spec(argv)
  if spec is not None:
    keys = [a[len("--config."):].split("=", 1)[0] for a in argv if a.startswith("--config.")]
    try:
      task_configs.check_preset(spec)
      task_configs.check_renamed(spec, keys)
    except ConfigError as e:
      _fail(str(e))
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, ValueError, TypeError) as e:
    hint = _unknown_key_hint(argv)
    _fail(hint or str(e).strip("'\"").replace("\\n", "\n").replace("\\'", "'"))


def _exit_for(summary) -> None:
  """Ends a task whose run was preempted (checkpoint written, resumable) with its own exit
  status, `runs.summary.PREEMPTED_EXIT`, once every process got here; else returns."""
  from helpsteer_jax.runs import summary as summary_lib
  status = summary_lib.exit_status(summary)
  if status:
    sys.exit(status)


class _QuietLibraries:
  """Drops INFO records of chatty libraries (Orbax logs every save phase)."""

  PREFIXES = ("orbax", "etils", "grain", "jax._src")

  def filter(self, record) -> bool:
    if record.levelno > 20:
      return True
    path = record.pathname.replace("\\", "/")
    return not any(f"/{p.replace('.', '/')}/" in path for p in self.PREFIXES)


def main(argv: list[str]) -> None:
  logging.get_absl_handler().addFilter(_QuietLibraries())
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from helpsteer_jax import run_checks, tasks
  config = _CONFIG.value
  if config is None:
    _fail("--config=<task>[:preset] is required (--help lists the tasks)")
  recorded = None
  try:
    task = tasks.get_task(config.task)
    workdir, warnings = run_checks.before_run(
        config, _config_spec(sys.argv) or "",
        config_flags.get_override_values(flags.FLAGS["config"]), _WORKDIR.value)
    if config.get("compile_only"):
      for line in warnings:
        logging.warning("%s", line)
      from helpsteer_jax import aot
      aot.run(config, workdir)
      return
    from helpsteer_jax import distributed
    distributed.initialize(config.get("distributed"))
    distributed.quiet_non_primary()
    for line in warnings:
      logging.warning("%s", line)
    logging.info("task=%s workdir=%s", config.task, workdir)
    if getattr(task, "RESUMES", False):
      from helpsteer_jax import run_fingerprint
      recorded = run_fingerprint.check_or_record(config, workdir)
    from helpsteer_jax import compile_cache
    compile_cache.configure(config, workdir)
    summary = task.run(config, workdir)
    distributed.finish()
    _exit_for(summary)
  except DataError as e:
    if recorded is not None:
      recorded.undo_unused()
    can_skip = e.skippable and "on_bad_record" in config.get("data", {})
    _fail(f"{e}\n(fix the record, or run with --config.data.on_bad_record=skip to skip"
          " bad records and have them counted and reported at the end)" if can_skip else str(e))
  except HelpsteerError as e:
    if recorded is not None:
      recorded.undo_unused()
    _fail(str(e))
  except Exception:  # noqa: BLE001 - see distributed.exit_after_error
    jax = sys.modules.get("jax")
    if jax is not None and jax.distributed.is_initialized() and jax.process_count() > 1:
      from helpsteer_jax import distributed
      distributed.exit_after_error()
    raise


def run() -> None:
  if any(a in _HELP for a in sys.argv[1:]):  # before JAX is probed for platforms: no JAX
    print(task_configs.help_text(_program(sys.argv[0])))
    sys.exit(0)
  cpu_env.reexec_with_malloc_tunables()
  platforms.skip_absent_tpu()
  # transformers serves tokenizers, configs and HF files here, never PyTorch models: its
  # advice that PyTorch is missing (the core installs none) would read as an error.
  os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
