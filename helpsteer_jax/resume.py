"""Resumable JSONL outputs: one row per input, in input order, appended as work goes.

Process 0 appends each batch's rows and syncs them to disk. On a rerun it
cuts off a torn last line, checks that the last complete row belongs to the
input at its position, and tells every process how many rows exist
(`resume_point`), so all of them continue from the same row. A task restarts
at the beginning of the batch that row falls in (`batch_start`) and writes
only the rows after it, so batches, and the seeds derived from their
positions, are those of an uninterrupted run (`append_batches` is that loop).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Callable, Iterable, Sequence, TypeVar

from absl import logging

from helpsteer_jax import multihost, processes
from helpsteer_jax.errors import ConfigError

T = TypeVar("T")


def _complete_rows(path: pathlib.Path, inputs: Sequence[T], matches: Callable[[dict, T], bool],
                   option: str) -> int:
  if not path.exists():
    return 0
  with open(path, "rb+") as f:
    data = f.read()
    good_end = data.rfind(b"\n") + 1
    if good_end < len(data):
      logging.warning("%s: cutting off a torn last line (%d bytes)", path, len(data) - good_end)
      f.truncate(good_end)
  lines = data[:good_end].splitlines()
  done = len(lines)
  if done > len(inputs):
    raise ConfigError(f"{path} holds {done} rows but the input has {len(inputs)}: it was"
                      f" written from another input; choose another {option}")
  if done:
    try:
      last = json.loads(lines[-1])
    except ValueError:
      last = None
    if not isinstance(last, dict) or not matches(last, inputs[done - 1]):
      raise ConfigError(f"{path}: row {done} does not match input row {done}; it was written"
                        f" from another input: choose another {option}")
  return done


def resume_point(path: pathlib.Path, inputs: Sequence[T], matches: Callable[[dict, T], bool],
                 option: str) -> int:
  """Rows of `path` already written for `inputs` (decided on process 0, the same everywhere).

  A torn last line is cut off; ConfigError when the rows belong to another input.
  """
  return multihost.on_primary(lambda: _complete_rows(path, inputs, matches, option))


def batch_start(done: int, batch: int, total: int) -> int:
  """The first row of the batch that row `done` falls in (`total` when all are done)."""
  return total if done >= total else done - done % batch


class RowWriter:
  """Appends JSON rows to `path` on process 0, flushed and fsynced per `write`."""

  def __init__(self, path: pathlib.Path):
    self._file = open(path, "a", encoding="utf-8") if processes.is_primary() else None

  def write(self, rows: Iterable[dict]) -> None:
    if self._file is None:
      return
    self._file.writelines(json.dumps(row) + "\n" for row in rows)
    self._file.flush()
    os.fsync(self._file.fileno())

  def close(self) -> None:
    if self._file is not None:
      self._file.close()

  def __enter__(self) -> "RowWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def append_batches(path: pathlib.Path, inputs: Sequence[T], matches: Callable[[dict, T], bool],
                   option: str, batch: int,
                   answer: Callable[[int, Sequence[T]], list[dict]]) -> int:
  """Appends `answer(start, inputs[start:start + batch])` for the rows not yet in `path`;
  returns how many rows were there already.

  The batch the last run stopped in is answered whole (the same batch, and
  the same `start` for a seed derived from it, as an uninterrupted run) and
  only its missing rows are written.
  """
  done = resume_point(path, inputs, matches, option)
  with RowWriter(path) as writer:
    for start in range(batch_start(done, batch, len(inputs)), len(inputs), batch):
      rows = answer(start, inputs[start:start + batch])
      writer.write(row for i, row in enumerate(rows, start) if i >= done)
  return done
