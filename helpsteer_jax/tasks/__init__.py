"""One module per task; each exposes `run(config, workdir)`, and may declare
`config_reads()` (the keys only some of its runs read) and `RESUMES` (a rerun resumes
the workdir's run)."""

from __future__ import annotations

import importlib
from types import ModuleType

from helpsteer_jax.errors import ConfigError

TASKS = {
    "model_smoke": "helpsteer_jax.tasks.model_smoke",
    "acsft": "helpsteer_jax.tasks.acsft",
    "attribute_model": "helpsteer_jax.tasks.attribute_model",
    "evaluate_rm": "helpsteer_jax.tasks.evaluate_rm",
    "export_rm": "helpsteer_jax.tasks.export_rm",
    "expo": "helpsteer_jax.tasks.expo",
    "annotate": "helpsteer_jax.tasks.annotate",
    "dpo2d": "helpsteer_jax.tasks.dpo2d",
    "build_2d": "helpsteer_jax.tasks.build_2d",
    "generate": "helpsteer_jax.tasks.generate",
    "evaluate_generation": "helpsteer_jax.tasks.evaluate_generation",
    "steering_sweep": "helpsteer_jax.tasks.steering_sweep",
    "serve": "helpsteer_jax.tasks.serve",
    "rl": "helpsteer_jax.tasks.rl",
    "steerlm2": "helpsteer_jax.tasks.steerlm2",
    "iterative_dpo": "helpsteer_jax.tasks.iterative_dpo",
}


def config_reads(task: ModuleType) -> list:
  """The task's rules of which keys only some runs read (`config_reads`; none: every key
  is read by every run)."""
  reads = getattr(task, "config_reads", None)
  return reads() if reads is not None else []


def get_task(name: str) -> ModuleType:
  if name not in TASKS:
    raise ConfigError(f"Unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}")
  return importlib.import_module(TASKS[name])
