"""HelpSteer / HelpSteer2 rows and NeMo SteerLM conversations -> `Conversation`s.

`read_records` reads files, directories or hub ids (see
`rows.resolve_source`) in the "auto", "helpsteer" or "steerlm" format;
`task_source.load_conversations` picks between it and the TFDS dataset.

Scores must be ints in 0..4: HelpSteer and HelpSteer2 ship JSON integers
(int64 columns in parquet), so a float such as 3.0 means the file was
produced by something else and is rejected rather than guessed at; bool is
not an integer either.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Iterator, Mapping

import numpy as np

from helpsteer_jax.data.formats.rows import (
  BadRecord,
  BadRecordReport,
  check_on_bad_record,
  iter_checked_rows,
  iter_rows,
  required,
  required_text,
  resolve_source,
  row_numbered,
)
from helpsteer_jax.data.records import (
  HELPSTEER_ATTRIBUTES,
  MAX_SCORE,
  MIN_SCORE,
  ROLES,
  Conversation,
  Turn,
)
from helpsteer_jax.data.template import (
  DEFAULT_SYSTEM,
  label_string,
  parse_label_string,
  split_helpsteer_prompt,
)
from helpsteer_jax.errors import ConfigError

FORMATS = ("auto", "helpsteer", "steerlm")


def _score(row: Mapping, name: str) -> int:
  value = required(row, name)
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise BadRecord("score not an integer", f"{name}={value!r}")
  if not MIN_SCORE <= value <= MAX_SCORE:
    raise BadRecord(f"score outside {MIN_SCORE}..{MAX_SCORE}", f"{name}={value}")
  return int(value)


def helpsteer_fields(row: Mapping) -> tuple[str, str, dict[str, int]]:
  """(prompt, response, scores) of a HelpSteer / HelpSteer2 row, or BadRecord."""
  if not isinstance(row, Mapping):
    raise BadRecord("not a JSON object", type(row).__name__)
  prompt, response = required_text(row, "prompt"), required_text(row, "response")
  return prompt, response, {name: _score(row, name) for name in HELPSTEER_ATTRIBUTES}


def helpsteer_conversation(prompt: str, response: str, scores: Mapping[str, int],
                           source: str = "") -> Conversation:
  """A HelpSteer row as a conversation: the prompt's turns, then the labelled response."""
  scores = {name: scores[name] for name in HELPSTEER_ATTRIBUTES if name in scores}
  turns = (*split_helpsteer_prompt(prompt), Turn("Assistant", response, label_string(scores)))
  return Conversation(system=DEFAULT_SYSTEM, turns=tuple(turns), mask_role="User",
                      attributes=scores, source=source)


def _helpsteer_row(row: Mapping, where: str) -> Conversation:
  return helpsteer_conversation(*helpsteer_fields(row), source=where)


def _steerlm_turn(turn: Any, j: int) -> Turn:
  if not isinstance(turn, Mapping):
    raise BadRecord("turn is not an object", f"turn {j}: {type(turn).__name__}")
  for key in ("from", "value"):
    if turn.get(key) is None:
      raise BadRecord(f"turn without '{key}'", f"turn {j}")
  role, value, label = turn["from"], turn["value"], turn.get("label")
  if role not in ROLES:
    raise BadRecord("unknown role", f"turn {j}: 'from' is {role!r}, expected User or Assistant")
  if not isinstance(value, str):
    raise BadRecord("wrong type for 'value'", f"turn {j}: {type(value).__name__}")
  if not value.strip():
    raise BadRecord("empty value", f"turn {j}: empty or whitespace only")
  if label is not None:
    if not isinstance(label, str):
      raise BadRecord("wrong type for 'label'", f"turn {j}: {type(label).__name__}")
    try:
      parse_label_string(label)
    except ValueError as e:
      raise BadRecord("invalid label", f"turn {j}: {e}") from None
  return Turn(role, value, label)


def _steerlm_row(row: Mapping, where: str) -> Conversation:
  if not isinstance(row, Mapping):
    raise BadRecord("not a JSON object", type(row).__name__)
  convs = required(row, "conversations")
  if not isinstance(convs, list):
    raise BadRecord("wrong type for 'conversations'",
                    f"expected a list, got {type(convs).__name__}")
  if not convs:
    raise BadRecord("empty conversations")
  system = required(row, "system")
  if not isinstance(system, str):
    raise BadRecord("wrong type for 'system'", f"expected a string, got {type(system).__name__}")
  mask = row.get("mask") or "User"
  if mask not in ROLES:
    raise BadRecord("invalid mask", f"'mask' is {mask!r}, expected User or Assistant")
  if row.get("type") not in (None, "VALUE_TO_TEXT"):
    raise BadRecord("unsupported type",
                    f"'type' is {row['type']!r}; only VALUE_TO_TEXT is supported")
  turns = tuple(_steerlm_turn(t, j) for j, t in enumerate(convs, 1))
  last = turns[-1]
  attributes = None
  if last.role != mask and last.label:
    attributes = parse_label_string(last.label) or None
  return Conversation(system=system, turns=turns, mask_role=mask, attributes=attributes,
                      source=where)


def steerlm_row(conv: Conversation) -> dict:
  """A conversation in NeMo's SteerLM jsonl format (what `_steerlm_row` reads back)."""
  return {"system": conv.system, "mask": conv.mask_role, "type": "VALUE_TO_TEXT",
          "conversations": [{"from": t.role, "value": t.text, "label": t.label}
                            for t in conv.turns]}


_CONVERTERS = {"helpsteer": _helpsteer_row, "steerlm": _steerlm_row}


def _sniff(rows: Iterator[tuple[int, Any]]) -> tuple[str, Iterator[tuple[int, Any]]]:
  """The format of the first row that tells (default helpsteer), with the rows intact."""
  seen = []
  fmt = "helpsteer"
  for item in rows:
    seen.append(item)
    row = item[1]
    if isinstance(row, Mapping) and "conversations" in row:
      fmt = "steerlm"
      break
    if isinstance(row, Mapping) and ("prompt" in row or "response" in row):
      break
  return fmt, itertools.chain(seen, rows)


def read_records(source: str | os.PathLike, split: str = "train", fmt: str = "auto",
                 on_bad_record: str = "error",
                 report: BadRecordReport | None = None) -> list[Conversation]:
  """Conversations from HelpSteer rows or SteerLM conversations.

  `fmt` "auto" takes the format from the first row that has `conversations`
  (SteerLM) or `prompt`/`response` (HelpSteer).
  """
  if fmt not in FORMATS:
    raise ConfigError(f"unknown data format {fmt!r}; use one of {FORMATS}")
  check_on_bad_record(on_bad_record)
  kind, location = resolve_source(source, split)
  rows = iter_rows(kind, location, split)
  if fmt == "auto":
    fmt, rows = _sniff(rows)
  if kind == "hub":
    location = f"{location} [{split}]"
  checked = iter_checked_rows(rows, location, _CONVERTERS[fmt], on_bad_record, report,
                              by_row=row_numbered(kind))
  return [conv for _, conv in checked]


def read_helpsteer(source: str | os.PathLike, split: str = "train",
                   on_bad_record: str = "error",
                   report: BadRecordReport | None = None) -> list[Conversation]:
  """HelpSteer / HelpSteer2 rows (prompt, response, five 0..4 scores) as conversations."""
  return read_records(source, split, "helpsteer", on_bad_record, report)


def read_steerlm_conversations(source: str | os.PathLike, on_bad_record: str = "error",
                               report: BadRecordReport | None = None, *,
                               split: str = "train") -> list[Conversation]:
  """NeMo SteerLM chat rows ({"system", "conversations", "mask", "type"}).

  Labels are kept as given (validated by parsing); a missing or null label
  stays None (annotation input).
  """
  return read_records(source, split, "steerlm", on_bad_record, report)
