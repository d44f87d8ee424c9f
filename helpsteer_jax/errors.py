"""Errors the user can act on (printed without a traceback by the CLI)."""

from __future__ import annotations


class HelpsteerError(Exception):
  """Base class: the message says what is wrong and what to change."""


class ConfigError(HelpsteerError, ValueError):
  """A configuration that cannot work (found before compiling)."""


class TrainingError(HelpsteerError, RuntimeError):
  """Training cannot go on (e.g. a run of non-finite losses); says where and why."""


class EvaluationError(HelpsteerError, RuntimeError):
  """An evaluation that measured nothing (every response unscored); says why and what to
  change."""


class DataError(HelpsteerError, ValueError):
  """A malformed input record; names the file and line. `skippable`: one record is bad
  and its reader would skip it with `on_bad_record="skip"` (False: the file itself is
  unreadable, or its reader cannot skip), so that the CLI offers the skip only where it
  works."""

  def __init__(self, path: str, line: int | None, reason: str, skippable: bool = False):
    self.path, self.line, self.reason = str(path), line, reason
    self.skippable = bool(skippable)
    where = f"{self.path}:{line}" if line is not None else self.path
    super().__init__(f"{where}: {reason}")

  def __reduce__(self):
    return (type(self), (self.path, self.line, self.reason, self.skippable))
