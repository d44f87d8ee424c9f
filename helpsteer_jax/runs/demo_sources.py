"""The data the training and scoring tasks read when none is configured: the configured
sources, or the demo rows written once (process 0) and returned."""

from __future__ import annotations

import pathlib
from typing import Callable

import ml_collections

from helpsteer_jax import runtime
from helpsteer_jax.data.demo import rows as demo_rows


def _configured_or_demo(config: ml_collections.ConfigDict, workdir: pathlib.Path, marker: str,
                        write: Callable) -> tuple[str, str]:
  data = config.data
  if data.train_path:
    return data.train_path, data.validation_path
  demo_dir = runtime.write_once(workdir / "demo_data", marker, lambda d: (
      write(d, data.demo_train_rows, data.demo_validation_rows)))
  return str(demo_dir), str(demo_dir)


def helpsteer_sources(config: ml_collections.ConfigDict,
                      workdir: pathlib.Path) -> tuple[str, str]:
  """(train, validation) HelpSteer-format sources; the demo rows when none is configured."""
  return _configured_or_demo(config, workdir, "validation.jsonl.gz",
                             demo_rows.write_demo_dataset)


def preference_sources(config: ml_collections.ConfigDict,
                       workdir: pathlib.Path) -> tuple[str, str]:
  """(train, validation) HelpSteer2-Preference sources; the demo pairs when none is configured."""
  return _configured_or_demo(config, workdir, "preference/preference.jsonl.gz",
                             demo_rows.write_demo_preference)


def rewardbench_source(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> str:
  """The demo's RewardBench-format file (the demo validation pairs, `rewardbench/`)."""
  data = config.data
  demo_dir = runtime.write_once(workdir / "demo_data", "rewardbench/filtered.jsonl", lambda d: (
      demo_rows.write_demo_rewardbench(d, data.demo_train_rows, data.demo_validation_rows)))
  return str(demo_dir / "rewardbench")
