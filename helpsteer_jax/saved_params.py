"""A training run's saved model parameters: where they are and how they are read (and written).

Every task that starts from another run (generate, serve, 2D-DPO's policy,
the attribute model and its scorers) names the run by its workdir or its
`checkpoints/` directory; `checkpoint_dir` is the one rule that resolves
either, `run_tokenizer_dir` the one that finds the tokenizer the run
trained with. Only the `state/params` item of a checkpoint is read (the
optimizer state and the data position stay on disk), through Orbax's
PyTree checkpointer, so reading needs neither the training loop nor grain.
`save_params` writes parameters that no training run produced (ExPO's) in
that same layout, so every reader takes them as a run.
"""

from __future__ import annotations

import contextlib
import logging as std_logging
import pathlib
from typing import Any, Iterator

import jax
import orbax.checkpoint as ocp
from absl import logging

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models.hf import TOKENIZER_FILES

# Names inside a training workdir (train/checkpoint.py writes CHECKPOINTS, the
# export HF_EXPORT, tasks without an HF tokenizer DEMO_TOKENIZER).
CHECKPOINTS, HF_EXPORT, DEMO_TOKENIZER = "checkpoints", "hf", "demo_tokenizer"


class _NoItemMetadataNotice(std_logging.Filter):
  """Orbax warns that an item directory (`<step>/state`) has no `_CHECKPOINT_METADATA`
  whenever one is read on its own: the file belongs to the step directory, so the
  notice is expected there and reads like an error."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Metadata file does not exist")


@contextlib.contextmanager
def item_reads() -> Iterator[None]:
  """Reads of one checkpoint item, without Orbax's expected missing-metadata notice."""
  logger, notice = std_logging.getLogger("absl"), _NoItemMetadataNotice()
  logger.addFilter(notice)
  try:
    yield
  finally:
    logger.removeFilter(notice)


def _steps(directory: pathlib.Path) -> list[int]:
  return sorted(ocp.utils.checkpoint_steps(directory)) if directory.is_dir() else []


def checkpoint_dir(path: str | pathlib.Path) -> pathlib.Path:
  """The Orbax directory of a training run: `<workdir>/checkpoints`, or `path` itself when
  it holds step directories; ConfigError otherwise."""
  path = pathlib.Path(path).expanduser().absolute()
  for directory in (path / CHECKPOINTS, path):
    if _steps(directory):
      return directory
  raise ConfigError(f"no Orbax checkpoint in {path} (expected <workdir>/{CHECKPOINTS}/<step>"
                    " written by a training task); train one first (`helpsteer-jax --help`"
                    " says which task writes it: `helpsteer-jax --config=acsft` writes"
                    " workdir/acsft, the aligning tasks' default start) or fix the path")


def resolve(path: str | pathlib.Path, step: int | None = None) -> tuple[pathlib.Path, int]:
  """(checkpoint directory, step): the latest step unless `step` >= 0 names one."""
  directory = checkpoint_dir(path)
  steps = _steps(directory)
  chosen = steps[-1] if step is None or step < 0 else step
  if chosen not in steps:
    raise ConfigError(f"no checkpoint of step {step} in {directory} (steps: {steps})")
  return directory, chosen


def run_dir(path: str | pathlib.Path) -> pathlib.Path:
  """The training workdir that holds the checkpoint at `path`."""
  return checkpoint_dir(path).parent


def run_tokenizer_dir(path: str | pathlib.Path) -> pathlib.Path | None:
  """The tokenizer a run trained with: its HF export's, else its demo tokenizer (None if
  neither has tokenizer files)."""
  root = run_dir(path)
  for candidate in (root / HF_EXPORT, root / DEMO_TOKENIZER):
    if has_tokenizer(candidate):
      return candidate
  return None


def has_tokenizer(directory: str | pathlib.Path) -> bool:
  return any((pathlib.Path(directory) / name).is_file() for name in TOKENIZER_FILES)


def _state_path(directory: pathlib.Path, step: int) -> pathlib.Path:
  return directory / str(step) / "state"


def params_metadata(directory: pathlib.Path, step: int) -> Any:
  """The saved `params` tree of a checkpoint, as array metadata (shapes, dtypes)."""
  with item_reads():
    metadata = ocp.PyTreeCheckpointer().metadata(_state_path(directory, step))
  tree = getattr(metadata, "item_metadata", metadata)
  tree = getattr(tree, "tree", tree)
  return tree["params"]


def param_shapes(path: str | pathlib.Path, step: int | None = None
                 ) -> tuple[dict[tuple[str, ...], tuple[int, ...]], int]:
  """Shapes of the saved model parameters by path, and the step read."""
  directory, step = resolve(path, step)
  saved = params_metadata(directory, step)
  leaves = jax.tree_util.tree_leaves_with_path(saved, is_leaf=lambda x: hasattr(x, "shape"))
  return {tuple(k.key for k in p): tuple(m.shape) for p, m in leaves}, step


def restore_params(path: str | pathlib.Path, abstract_params: Any,
                   step: int | None = None) -> tuple[Any, int]:
  """The model parameters of a training run's checkpoint (any task), and the step.

  `abstract_params` is a tree of ShapeDtypeStructs with shardings (Orbax
  reads each shard onto its device, casting to the target dtype); it may be
  a subtree of what was saved (a reward model's backbone, say). Shapes are
  checked first, so a model config that differs from the training run's
  names the parameter.
  """
  directory, step = resolve(path, step)
  saved, _ = param_shapes(directory, step)
  for key_path, want in jax.tree_util.tree_leaves_with_path(abstract_params):
    key = tuple(k.key for k in key_path)
    name = "/".join(key)
    if key not in saved:
      raise ConfigError(f"checkpoint {directory}/{step} has no parameter {name}: use the"
                        " model config of the training run")
    if saved[key] != tuple(want.shape):
      raise ConfigError(
          f"checkpoint {directory}/{step}: parameter {name} has shape {saved[key]} but the"
          f" model config gives {tuple(want.shape)}; pass the same --config.model.*"
          " (model name and shape) as the training run")
  target = {"params": abstract_params}
  args = ocp.args.PyTreeRestore(
      item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
      partial_restore=True)
  with item_reads(), ocp.PyTreeCheckpointer() as checkpointer:
    restored = checkpointer.restore(_state_path(directory, step), args=args)
  logging.info("restored the parameters of step %d from %s", step, directory)
  return restored["params"], step


def save_params(workdir: str | pathlib.Path, params: Any, step: int = 0) -> pathlib.Path:
  """Writes `params` (a pure dict of sharded arrays) as `<workdir>/checkpoints/<step>`, the
  layout training writes and `restore_params` reads (a `state` item holding `params`;
  no optimizer state, no data position). Every process calls it (Orbax writes each
  process's shards, process 0 the metadata); returns the checkpoint directory."""
  directory = pathlib.Path(workdir).expanduser().absolute() / CHECKPOINTS
  options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)
  with ocp.CheckpointManager(directory, options=options, item_names=("state",)) as manager:
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"params": params})))
    manager.wait_until_finished()
  logging.info("saved the parameters as step %d in %s", step, directory)
  return directory
