"""The preamble every task runs.

`prepare` builds the mesh and rules, checks that the workdir can be written,
and loads the tokenizer checked against the model config. The data a task reads
when none is configured is in `demo_sources` (HelpSteer rows, preference pairs,
RewardBench) and `setup_2d` (HelpSteer-2D pairs), so that a task that reads no
demo data loads none of their formats.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import ml_collections

from helpsteer_jax import runtime
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import hf
from helpsteer_jax.models.config import ModelConfig


@dataclasses.dataclass
class TaskSetup:
  workdir: pathlib.Path
  rt: runtime.Runtime
  tokenizer_dir: str | None = None
  tokenizer: Any = None
  model_cfg: ModelConfig | None = None


def prepare(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *,
            tokenizer: bool = True, model: bool = True,
            devices: list | None = None) -> TaskSetup:
  """Mesh (over `devices`, default all) and rules, the workdir checked, the tokenizer
  loaded and checked against the model; before any of it (and before anything is
  written), the training counts checked."""
  check_train_counts(config)
  setup = TaskSetup(pathlib.Path(workdir), runtime.setup(config, devices))
  runtime.check_workdir(setup.workdir)
  if tokenizer:
    setup.tokenizer_dir = runtime.tokenizer_dir(config, setup.workdir)
    setup.tokenizer = hf.load_tokenizer(setup.tokenizer_dir)
  if model:
    setup.model_cfg = runtime.model_config(config)
    if tokenizer:
      runtime.check_tokenizer_fits(setup.tokenizer, setup.model_cfg.vocab_size)
  return setup


# train.* counts that must be positive, and those for which 0 means never / all
_AT_LEAST_ONE = ("num_steps", "global_batch", "micro_batch", "seq_len", "log_every",
                 "save_every")
_AT_LEAST_ZERO = ("eval_every", "eval_batches")


def check_train_counts(config: ml_collections.ConfigDict) -> None:
  """ConfigError naming every `train.*` count out of range (a task without a train
  section passes)."""
  tc = config.get("train")
  if tc is None:
    return
  problems = [f"train.{k}={tc[k]} must be at least 1" for k in _AT_LEAST_ONE
              if k in tc and int(tc[k]) < 1]
  problems += [f"train.{k}={tc[k]} must be at least 0" for k in _AT_LEAST_ZERO
               if k in tc and int(tc[k]) < 0]
  if problems:
    raise ConfigError("; ".join(problems))
