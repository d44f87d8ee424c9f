"""Orbax checkpoints of the train state and the data position.

A checkpoint holds two items: `state` (the `TrainState`, restored onto
whatever mesh the current run uses: Orbax reshards on read) and `data` (the
grain iterator position of every process). Saves are asynchronous; only
complete checkpoints are listed, so a run killed mid-save resumes from the
last complete one. A listed checkpoint that does not read back (files
removed or truncated) is moved aside to `<workdir>/corrupt_checkpoints` with a
warning and the previous one is used; one whose arrays do not match the
current model is a configuration error, never silently skipped.

With a `BestMetric` (`train.export_best`) each evaluated step is saved with its eval
metrics in the checkpoint (Orbax's metrics item), and pruning keeps the best evaluated
checkpoint besides the latest `keep`: the best is read back from the checkpoints, so a
resumed run knows it without evaluating again.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any, Mapping, Sequence

import grain
import jax
import orbax.checkpoint as ocp
from absl import logging

from helpsteer_jax import multihost, processes, saved_params
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.errors import ConfigError

MODES = ("max", "min")


class _Manager(ocp.CheckpointManager):
  """Orbax's manager, asking the loop's preemption decision for this step.

  Orbax would otherwise call JAX's preemption sync point itself with the step
  number, interleaved with the loop's own calls (train/preemption.py).
  """

  preempted_at: int | None = None

  def reached_preemption(self, step: int) -> bool:
    return step == self.preempted_at


class _IteratorHandler(grain.checkpoint.CheckpointHandler):
  """grain's handler, restorable on another number of processes.

  Every process feeds the same global batches, so every process's iterator
  state is the same and any of them restores a run of any process count.
  """

  def restore(self, directory, item=None, args=None):
    from grain._src.core import sharding as grain_sharding
    index, count = grain_sharding.get_process_index_and_count()
    own = directory / f"process_{index}-of-{count}.json"
    if not own.exists():
      saved = (sorted(directory.glob("process_0-of-*.json"))
               or sorted(directory.glob("process_*.json")))
      if not saved:
        raise ValueError(f"no data iterator state in {directory}")
      item = item or args.item
      state = saved[0].read_text()
      item.set_state(json.loads(state) if isinstance(item, grain.DatasetIterator)
                     else state.encode())
      item.start_prefetch()
      return item
    return super().restore(directory, item=item, args=args)


@ocp.args.register_with_handler(_IteratorHandler, for_save=True)
@dataclasses.dataclass
class IteratorSave(ocp.args.CheckpointArgs):
  item: Any


@ocp.args.register_with_handler(_IteratorHandler, for_restore=True)
@dataclasses.dataclass
class IteratorRestore(ocp.args.CheckpointArgs):
  item: Any


@dataclasses.dataclass(frozen=True)
class Best:
  """The best evaluated step: its `metric` (`mode`: whether higher or lower is better)."""
  step: int
  metric: str
  value: float
  mode: str


@dataclasses.dataclass(frozen=True)
class BestMetric:
  """The eval metric that picks the checkpoint to export (`train.export_best`) and whether
  a higher or a lower value is better (`mode`)."""
  name: str
  mode: str

  def score(self, metrics: Mapping[str, float] | None) -> float:
    """How good eval `metrics` are, higher better: the metric signed by `mode`, -inf
    without it (or NaN). Also Orbax's `best_fn`, which makes Orbax store the metrics."""
    value = float((metrics or {}).get(self.name, math.nan))
    return -math.inf if math.isnan(value) else value if self.mode == "max" else -value

  def best(self, evaluated: Sequence[tuple[int, Mapping[str, float] | None]]) -> Best | None:
    """The best of (step, eval metrics) pairs; a later step must be strictly better to
    win, steps without the metric (or NaN) never do; None when no step has it."""
    found = [(self.score(m), -step, step, m) for step, m in evaluated
             if self.score(m) > -math.inf]
    if not found:
      return None
    _, _, step, metrics = max(found, key=lambda f: f[:2])
    return Best(step, self.name, float(metrics[self.name]), self.mode)


class _LatestAndBest:
  """Orbax's preservation policy: what `max_to_keep=keep` keeps (its `LatestN`) and the
  best evaluated checkpoint (`BestMetric.best`), whatever its age."""

  def __init__(self, keep: int, best: BestMetric):
    self.latest, self.metric = ocp.checkpoint_managers.LatestN(keep), best

  def should_preserve(self, checkpoints: Sequence[Any], *, context: Any = None) -> list[bool]:
    latest = self.latest.should_preserve(checkpoints, context=context)
    best = self.metric.best([(c.step, c.metrics) for c in checkpoints])
    return [bool(keep) or (best is not None and c.step == best.step)
            for keep, c in zip(latest, checkpoints)]


class Checkpointer:
  """Save every `save_every` steps and on preemption, keep `keep`, resume from the latest.

  `extra_items` name further array trees saved beside the train state (the
  PPO critic's state), passed to `save` and `restore*` as `extra={name: tree}`.
  With `best` (see the module doc) every step saved with eval metrics is saved whatever
  `save_every` says, and the best evaluated one is kept besides the latest `keep`.
  """

  def __init__(self, directory: str | pathlib.Path, save_every: int, keep: int,
               async_save: bool = True, extra_items: tuple[str, ...] = (),
               best: BestMetric | None = None):
    self.directory = pathlib.Path(directory).absolute()
    self.best_metric = best
    policies = ocp.checkpoint_managers
    kept = (dict(max_to_keep=keep) if best is None else
            dict(preservation_policy=_LatestAndBest(keep, best), best_fn=best.score))
    options = ocp.CheckpointManagerOptions(
        enable_async_checkpointing=async_save, create=True,
        save_decision_policy=policies.AnySavePolicy([
            policies.FixedIntervalPolicy(max(int(save_every), 1)),
            policies.PreemptionCheckpointingPolicy()]), **kept)
    self.extra_items = tuple(extra_items)
    self.manager = _Manager(
        self.directory, options=options, item_names=("state", "data", *self.extra_items),
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "data": _IteratorHandler(),
                       **{k: ocp.StandardCheckpointHandler() for k in self.extra_items}})

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_iterator: Any, preempted: bool = False,
           force: bool = False, extra: dict[str, Any] | None = None,
           metrics: Mapping[str, float] | None = None) -> bool:
    """Saves when Orbax's policy says so (every `save_every` steps, or `preempted`); with
    a best metric, also a step evaluated (`metrics`, its eval metrics), and records them."""
    self.manager.preempted_at = step if preempted else None
    args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                              data=IteratorSave(data_iterator),
                              **{k: ocp.args.StandardSave(v) for k, v in (extra or {}).items()})
    tracked = {}
    if self.best_metric is not None:  # {} too: Orbax warns of a save without metrics
      tracked = {"metrics": {k: float(v) for k, v in (metrics or {}).items()}}
      force = force or bool(metrics)
    saved = self.manager.save(step, args=args, force=force, **tracked)
    if saved:
      logging.info("checkpoint: saving step %d to %s%s", step, self.directory,
                   " (preemption)" if preempted else "")
    return saved

  def save_final(self, step: int, state: Any, data_iterator: Any,
                 extra: dict[str, Any] | None = None,
                 metrics: Mapping[str, float] | None = None) -> None:
    """Saves `step` unless a checkpoint of it exists or is being written."""
    if step not in self.manager.all_steps():
      self.save(step, state, data_iterator, force=True, extra=extra, metrics=metrics)

  def best(self) -> Best | None:
    """The best evaluated checkpoint (None without a best metric or an evaluated one),
    read from the checkpoints' metrics by process 0 and the same on every process; call
    it after `wait`."""
    metric = self.best_metric
    if metric is None:
      return None

    def read() -> dict | None:
      best = metric.best([(s, self.manager.metrics(s)) for s in self.manager.all_steps()])
      return None if best is None else dataclasses.asdict(best)

    found = multihost.on_primary(read)
    return None if found is None else Best(**found)

  def params_at(self, step: int | None, current: int, params: Any, shardings: Any) -> Any:
    """The trained parameters of step `step`: the live state's `params` when `step` is
    None or `current` (the state's step), else checkpoint `step`'s alone (no optimizer
    state), restored onto `shardings`: what an export of an earlier step reads."""
    if step is None or step == current:
      return params
    return saved_params.restore_params(
        self.directory, sharding_lib.abstract_arrays(params, shardings), step)[0]

  def restore(self, step: int, abstract_state: Any, data_iterator: Any,
              extra: dict[str, Any] | None = None) -> Any:
    """Restores into `abstract_state`'s shardings; sets the iterator's position. With
    `extra` (abstract trees by item name): (state, {name: restored tree})."""
    args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                              data=IteratorRestore(data_iterator),
                              **{k: ocp.args.StandardRestore(v) for k, v in (extra or {}).items()})
    restored = self.manager.restore(step, args=args)
    logging.info("checkpoint: restored step %d from %s", step, self.directory)
    if extra is not None:
      return restored["state"], {k: restored[k] for k in extra}
    return restored["state"]

  def restore_latest(self, abstract_state: Any, data_iterator: Any,
                     extra: dict[str, Any] | None = None) -> Any | None:
    """The newest checkpoint that reads back (None if there is none); with `extra`, as
    `restore` returns it.

    Unreadable ones are moved aside with a warning; a readable one saved from
    another model or optimizer raises ConfigError.
    """
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        saved = _array_shapes(_saved_state_metadata(self.directory, step))
      except Exception as e:  # noqa: BLE001 - any unreadable metadata means a damaged checkpoint
        saved, error = [], f" ({type(e).__name__}: {e})"
      else:
        error = ""
      if not saved:
        self._move_aside(step, f"its array metadata is missing or unreadable{error}")
        continue
      wanted = _array_shapes(abstract_state)
      if saved != wanted:
        raise ConfigError(
            f"the checkpoint {self.directory / str(step)} holds arrays of other shapes than this"
            f" run's model and optimizer ({len(saved)} vs {len(wanted)} arrays, e.g."
            f" {sorted(set(saved) ^ set(wanted))[:3]}); it was written with another config:"
            " use another --workdir or the config it was trained with")
      try:
        return self.restore(step, abstract_state, data_iterator, extra)
      except Exception as e:  # noqa: BLE001 - shapes match, so a failed read is damage
        self._move_aside(step, f"it does not read back ({type(e).__name__}: {str(e)[:300]})")
    return None

  def _move_aside(self, step: int, reason: str) -> None:
    target = self.directory.parent / "corrupt_checkpoints" / str(step)
    logging.warning("checkpoint: skipping step %d in %s: %s; moved to %s, falling back to"
                    " the previous checkpoint", step, self.directory, reason, target)
    if processes.is_primary():
      target.parent.mkdir(parents=True, exist_ok=True)
      if target.exists():
        target = target.with_name(f"{step}.{len(list(target.parent.iterdir()))}")
      (self.directory / str(step)).rename(target)
    from helpsteer_jax import runtime
    runtime.sync(f"checkpoint_move_aside_{step}")
    self.manager.reload()

  def restore_state(self, step: int, abstract_state: Any) -> Any:
    """Only the train state (e.g. to initialise another task from it)."""
    restored = self.manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    return restored["state"]

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def _state_path(directory: pathlib.Path, step: int) -> pathlib.Path:
  return directory / str(step) / "state"


def _saved_state_metadata(directory: pathlib.Path, step: int) -> Any:
  with saved_params.item_reads():
    return ocp.StandardCheckpointer().metadata(_state_path(directory, step)).item_metadata


def _array_shapes(tree: Any) -> list[tuple[int, ...]]:
  """Sorted leaf shapes: compares a saved tree with a target whatever its containers."""
  return sorted(tuple(x.shape) for x in jax.tree.leaves(tree) if hasattr(x, "shape"))
