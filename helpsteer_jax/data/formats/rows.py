"""File rows and bad-row handling shared by every reader in `data.formats`.

A source is a file (`.jsonl`, `.jsonl.gz`, `.parquet`, or `.json` / `.json.gz` holding
one JSON list of rows, as RM-Bench ships), a directory holding
`{split}.jsonl.gz`, `{split}.jsonl` or `{split}.parquet` (HelpSteer and
HelpSteer2 as the hub ships them), or a hub id such as `nvidia/HelpSteer2`
that is not a local path (loaded with `datasets.load_dataset`).

Bad rows raise `DataError(path, line, reason)` (`on_bad_record="error"`) or
are skipped and counted by reason in a `BadRecordReport` ("skip"; a warning
with the summary is logged too, so none is dropped silently). Line numbers
are 1-based; for parquet files and hub datasets they are row numbers
(row index + 1), and messages say "row N"; in a JSON list a row's line is the line its
object starts on.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import zlib
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

from helpsteer_jax.errors import ConfigError, DataError, HelpsteerError

log = logging.getLogger(__name__)
T = TypeVar("T")
BAD_RECORD_MODES = ("error", "skip")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
_JSON_SUFFIXES = (".json", ".json.gz")


class BadRecordReport:
  """Skipped records: counts per reason and a few example locations."""

  max_examples = 3

  def __init__(self):
    self.counts: dict[str, int] = {}
    self.examples: dict[str, list[str]] = {}

  def add(self, path: str | os.PathLike, line: int | None, reason: str, detail: str = ""):
    self.counts[reason] = self.counts.get(reason, 0) + 1
    examples = self.examples.setdefault(reason, [])
    if len(examples) < self.max_examples:
      where = f"{os.fspath(path)}:{line}" if line is not None else os.fspath(path)
      examples.append(f"{where} ({detail})" if detail else where)

  @property
  def total(self) -> int:
    return sum(self.counts.values())

  def merge(self, other: BadRecordReport) -> BadRecordReport:
    """Adds `other`'s counts and examples to this report (in place); returns self."""
    for reason, count in other.counts.items():
      self.counts[reason] = self.counts.get(reason, 0) + count
      room = self.max_examples - len(self.examples.setdefault(reason, []))
      self.examples[reason] += other.examples.get(reason, [])[:max(room, 0)]
    return self

  def __add__(self, other: BadRecordReport) -> BadRecordReport:
    return BadRecordReport().merge(self).merge(other)

  def summary(self) -> str:
    if not self.total:
      return "no bad records"
    parts = [f"{count} x {reason} (e.g. {'; '.join(self.examples[reason])})"
             for reason, count in sorted(self.counts.items(), key=lambda kv: -kv[1])]
    return f"{self.total} bad record(s) skipped: " + ", ".join(parts)

  def __repr__(self) -> str:
    return f"BadRecordReport({self.counts})"


class BadRecord(Exception):
  """A row that cannot be used: `reason` is its category, `detail` the specifics."""

  def __init__(self, reason: str, detail: str = ""):
    super().__init__(f"{reason}: {detail}" if detail else reason)
    self.reason, self.detail = reason, detail


# ---------------------------------------------------------------- row sources


def iter_json_lines(path: str | os.PathLike) -> Iterator[tuple[int, dict | Exception]]:
  """(1-based line, object) for each non-blank line of a .jsonl / .jsonl.gz file.

  A line that is not valid JSON yields its exception (ValueError; TypeError
  for valid JSON that is not an object) instead of stopping the file. A
  truncated or corrupt gzip stream raises DataError naming the file.
  """
  path = os.fspath(path)
  opener = gzip.open if path.endswith(".gz") else open
  lineno = 0
  if opener is gzip.open and os.path.isfile(path) and not os.path.getsize(path):
    raise DataError(path, None, "empty file: a gzip stream has at least a header, so the"
                    " download or copy was cut off; fetch it again")
  try:
    with opener(path, "rb") as f:
      for lineno, raw in enumerate(f, 1):
        if not raw.strip():
          continue
        try:
          obj = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as e:  # bad JSON or UTF-8; absurd nesting
          yield lineno, e
          continue
        if isinstance(obj, dict):
          yield lineno, obj
        else:
          yield lineno, TypeError(f"expected a JSON object, got {type(obj).__name__}")
  except (EOFError, gzip.BadGzipFile, zlib.error) as e:
    raise DataError(path, None, f"truncated or corrupt gzip file (read {lineno} complete"
                    f" line(s)): {e}; download it again") from e


def iter_json_list(path: str | os.PathLike) -> Iterator[tuple[int, dict | Exception]]:
  """(line its object starts on, object) for each element of a file holding one JSON list
  (.json / .json.gz); an element that is not an object yields a TypeError. A file that is
  not one JSON list raises DataError naming the line where it stops parsing."""
  path = os.fspath(path)
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      text = f.read().decode("utf-8")
  except (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError) as e:
    raise DataError(path, None, f"unreadable JSON file: {e}") from e
  decoder = json.JSONDecoder()
  space = re.compile(r"\s*")
  pos, line, counted = space.match(text).end(), 1, 0

  def line_at(i: int) -> int:
    nonlocal line, counted
    line += text.count("\n", counted, i)
    counted = i
    return line

  if not text.startswith("[", pos):
    raise DataError(path, line_at(pos), "expected a JSON list of rows ('[' first)")
  pos = space.match(text, pos + 1).end()
  while not text.startswith("]", pos):
    try:
      obj, end = decoder.raw_decode(text, pos)
    except (ValueError, RecursionError) as e:
      raise DataError(path, line_at(pos), f"malformed JSON in the list: {e}") from None
    yield line_at(pos), (obj if isinstance(obj, dict) else
                         TypeError(f"expected a JSON object, got {type(obj).__name__}"))
    pos = space.match(text, end).end()
    if text.startswith(",", pos):
      pos = space.match(text, pos + 1).end()
    elif not text.startswith("]", pos):
      raise DataError(path, line_at(pos), "malformed JSON list: expected ',' or ']'")


def _iter_parquet(path: str) -> Iterator[tuple[int, dict]]:
  import pyarrow as pa
  import pyarrow.parquet as pq
  try:
    pf = pq.ParquetFile(path)
  except (pa.ArrowException, OSError) as e:
    raise DataError(path, None, f"not a readable parquet file: {e}") from e
  rows = (row for batch in pf.iter_batches(batch_size=1024) for row in batch.to_pylist())
  yield from enumerate(rows, 1)


def _iter_hub(repo_id: str, split: str) -> Iterator[tuple[int, dict]]:
  try:
    import datasets
  except ImportError as e:
    raise ConfigError(f"{repo_id!r} is not a local path, and loading it from the Hugging Face"
                      " hub needs the `datasets` package; download the files (e.g."
                      f" {split}.jsonl.gz) and pass their directory instead") from e
  try:
    ds = datasets.load_dataset(repo_id, split=split)
  except Exception as e:  # network, auth, unknown repo or split: all user-fixable
    raise ConfigError(f"{repo_id!r} is not a local path, and loading split {split!r} from the"
                      f" Hugging Face hub failed ({type(e).__name__}: {e}); download the"
                      f" files (e.g. {split}.jsonl.gz) and pass their directory instead") from e
  yield from enumerate(ds, 1)


def _file_kind(path: str) -> str:
  if path.endswith(_JSONL_SUFFIXES):
    return "jsonl"
  if path.endswith(".parquet"):
    return "parquet"
  if path.endswith(_JSON_SUFFIXES):
    return "json"
  raise ConfigError(f"{path}: unsupported file type; use .jsonl, .jsonl.gz, .parquet or"
                    " .json (a list of rows)")


def resolve_source(source: str | os.PathLike, split: str = "train") -> tuple[str, str]:
  """(kind, location): kind is "jsonl", "json", "parquet" or "hub"."""
  path = os.path.expanduser(os.fspath(source))
  if os.path.isdir(path):
    names = (f"{split}.jsonl.gz", f"{split}.jsonl", f"{split}.parquet")
    for name in names:
      if os.path.isfile(os.path.join(path, name)):
        return _file_kind(name), os.path.join(path, name)
    present = sorted(os.listdir(path))[:20]
    raise ConfigError(f"{path} holds none of {', '.join(names)} for split {split!r}"
                      f" (it holds: {', '.join(present) or 'nothing'})")
  if os.path.isfile(path):
    return _file_kind(path), path
  looks_local = path.startswith((os.sep, ".", "~")) or path.endswith(
      (*_JSONL_SUFFIXES, ".parquet", ".gz", ".json"))
  if not looks_local and _HUB_ID.fullmatch(path):
    return "hub", path
  raise ConfigError(f"{path} does not exist (expected a file, a directory, or a hub id"
                    " such as nvidia/HelpSteer2)")


def row_numbered(kind: str) -> bool:
  """Whether a source kind's positions are row numbers (parquet, hub), not file lines."""
  return kind in ("parquet", "hub")


def read_checked(kind: str, location: str, split: str, check: Callable[[Any, str], T],
                 on_bad_record: str = "error", report: BadRecordReport | None = None
                 ) -> list[T]:
  """check(row, "location:line") for every good row of a resolved source (see
  resolve_source); bad rows per on_bad_record (iter_checked_rows)."""
  check_on_bad_record(on_bad_record)
  rows = iter_rows(kind, location, split)
  if kind == "hub":
    location = f"{location} [{split}]"
  return [item for _, item in iter_checked_rows(rows, location, check, on_bad_record, report,
                                                by_row=row_numbered(kind))]


def iter_rows(kind: str, location: str, split: str = "train") -> Iterator[tuple[int, Any]]:
  """(line or row number, row) from a resolved source (see resolve_source)."""
  if kind == "jsonl":
    return iter_json_lines(location)
  if kind == "json":
    return iter_json_list(location)
  if kind == "parquet":
    return _iter_parquet(location)
  return _iter_hub(location, split)


# ---------------------------------------------------------------- validation


def required(row: Mapping, name: str, what: str = "field") -> Any:
  """`row[name]`, or BadRecord when it is missing or null."""
  if row.get(name) is None:
    raise BadRecord(f"missing {what} '{name}'")
  return row[name]


def required_text(row: Mapping, name: str) -> str:
  """A non-empty string field, or BadRecord."""
  value = required(row, name)
  if not isinstance(value, str):
    raise BadRecord(f"wrong type for '{name}'", f"expected a string, got {type(value).__name__}")
  if not value.strip():
    raise BadRecord(f"empty {name}", "empty or whitespace only")
  return value


# ---------------------------------------------------------------- checking rows


def check_on_bad_record(on_bad_record: str):
  """ConfigError unless on_bad_record is "error" or "skip"."""
  if on_bad_record not in BAD_RECORD_MODES:
    raise ConfigError(f"on_bad_record must be one of {BAD_RECORD_MODES}, got {on_bad_record!r}")


def iter_checked_rows(rows: Iterable[tuple[int, Any]], location: str,
                      check: Callable[[Any, str], T], on_bad_record: str = "error",
                      report: BadRecordReport | None = None,
                      by_row: bool = False) -> Iterator[tuple[int, T]]:
  """(line, check(row, "location:line")) for each good row; bad rows per on_bad_record.

  `by_row`: line numbers are row numbers (parquet, hub), said so in messages.
  """
  check_on_bad_record(on_bad_record)
  local = BadRecordReport()
  for line, row in rows:
    try:
      if isinstance(row, Exception):
        reason = "not a JSON object" if isinstance(row, TypeError) else "malformed JSON"
        raise BadRecord(reason, str(row))
      try:
        checked = check(row, f"{location}:{line}")
      except HelpsteerError:
        raise
      except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError,
              RecursionError) as e:  # a shape no check anticipated: still this row's fault
        raise BadRecord("invalid record", f"{type(e).__name__}: {str(e)[:200]}") from None
      yield line, checked
    except BadRecord as bad:
      prefix = f"row {line}: " if by_row else ""
      if on_bad_record == "error":
        raise DataError(location, line, prefix + str(bad), skippable=True) from None
      local.add(location, line, bad.reason, prefix + bad.detail)
  if local.total:
    log.warning("%s: %s", location, local.summary())
    if report is not None:
      report.merge(local)
