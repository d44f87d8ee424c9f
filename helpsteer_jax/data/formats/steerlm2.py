"""SteerLM 2.0 training groups in NeMo-Aligner's JSONL format (one group per line).

  {"system": str,
   "prompt_turns": [{"from": "User", "value": str}, ...],   (odd count, User last)
   "label": "helpfulness:4,...",                               (the requested attributes)
   "responses": [{"from": "Assistant", "value": str,
                  "log(P(a|x,y))": float, "log(P(y|x))": float, "log(Q(y|a,x))": float},
                 ...]}                                          (n >= 2, the same n per file)

The sampling phase writes it; the training phase (and NeMo-Aligner's
`train_steerlm2.py`) reads it. Bad rows raise `DataError(file, line, why)`
or are skipped and counted (`on_bad_record="skip"`), as in `rows`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Mapping, Sequence

from helpsteer_jax.data import template
from helpsteer_jax.data.formats.rows import (
  BadRecord,
  BadRecordReport,
  iter_checked_rows,
  iter_json_lines,
  required,
  required_text,
)
from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.errors import ConfigError

LOG_P_ATTRIBUTES, LOG_P_UNCONDITIONAL, LOG_Q = "log(P(a|x,y))", "log(P(y|x))", "log(Q(y|a,x))"


@dataclasses.dataclass(frozen=True)
class Response:
  """One sampled response and its three log-probabilities."""

  text: str
  log_p_attributes: float
  log_p_unconditional: float
  log_q: float


@dataclasses.dataclass(frozen=True)
class Group:
  """n responses to one prompt under one attribute string."""

  system: str
  turns: tuple[Turn, ...]
  label: str
  responses: tuple[Response, ...]
  source: str = ""

  def conversation(self, response: str, labelled: bool = True) -> Conversation:
    """The prompt answered by `response` as the last, trained, assistant turn (its label
    the group's, or none: the unconditional model's input); earlier turns are context."""
    context = tuple(dataclasses.replace(t, trainable=False) for t in self.turns)
    last = Turn("Assistant", response, self.label if labelled else None)
    return Conversation(self.system, context + (last,), source=self.source)


def _number(item: Mapping, key: str, where: str) -> float:
  value = required(item, key)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise BadRecord(f"{key} is not a finite number", f"{where}: {value!r}")
  return float(value)


def _turns(row: Mapping) -> tuple[Turn, ...]:
  turns = required(row, "prompt_turns")
  if not isinstance(turns, list) or len(turns) % 2 != 1:
    raise BadRecord("prompt_turns must be a list of an odd number of turns (User first and"
                    " last)", repr(turns)[:80])
  out = []
  for k, turn in enumerate(turns):
    role = "User" if k % 2 == 0 else "Assistant"
    if not isinstance(turn, Mapping) or turn.get("from") != role:
      raise BadRecord("turns must alternate User / Assistant",
                      f"prompt_turns[{k}] is not from {role!r}")
    out.append(Turn(role, required_text(turn, "value")))
  return tuple(out)


def _group(row: Any, where: str) -> Group:
  if not isinstance(row, Mapping):
    raise BadRecord("not a JSON object", type(row).__name__)
  label = required(row, "label")
  try:
    template.parse_label_string(label)
  except ValueError as e:
    raise BadRecord("bad label", str(e)) from None
  responses = required(row, "responses")
  if not isinstance(responses, list) or len(responses) < 2:
    raise BadRecord("responses must be a list of at least 2", repr(responses)[:80])
  out = []
  for k, item in enumerate(responses):
    if not isinstance(item, Mapping) or item.get("from", "Assistant") != "Assistant":
      raise BadRecord("a response must be an object from 'Assistant'", f"responses[{k}]")
    at = f"responses[{k}]"
    text = required(item, "value")
    if not isinstance(text, str):  # an empty response is a sample like any other
      raise BadRecord("a response's value is not a string", f"{at}: {type(text).__name__}")
    out.append(Response(text, _number(item, LOG_P_ATTRIBUTES, at),
                        _number(item, LOG_P_UNCONDITIONAL, at), _number(item, LOG_Q, at)))
  system = row.get("system", template.DEFAULT_SYSTEM)
  if not isinstance(system, str):
    raise BadRecord("system is not a string", type(system).__name__)
  return Group(system, _turns(row), label, tuple(out), where)


def read_groups(path: str | os.PathLike, on_bad_record: str = "error",
                report: BadRecordReport | None = None) -> list[Group]:
  """The groups of a `.jsonl` file; every group must have the same number of responses."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ConfigError(f"{path} does not exist (expected SteerLM 2.0 groups as JSONL)")
  groups = [g for _, g in iter_checked_rows(iter_json_lines(path), path, _group, on_bad_record,
                                            report)]
  sizes = sorted({len(g.responses) for g in groups})
  if len(sizes) > 1:
    raise ConfigError(f"{path}: groups of {sizes} responses; SteerLM 2.0 trains groups of"
                      " one size (a batch is groups x responses x tokens)")
  return groups


def group_row(group: Group) -> dict:
  """`group` as one line of the file."""
  return {
      "system": group.system,
      "prompt_turns": [{"from": t.role, "value": t.text} for t in group.turns],
      "label": group.label,
      "responses": [{"from": "Assistant", "value": r.text, LOG_P_ATTRIBUTES: r.log_p_attributes,
                     LOG_P_UNCONDITIONAL: r.log_p_unconditional, LOG_Q: r.log_q}
                    for r in group.responses]}


def write_groups(path: str | os.PathLike, groups: Sequence[Group]) -> None:
  """All of `groups`, written to a temporary file and renamed."""
  tmp = f"{os.fspath(path)}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for g in groups:
      f.write(json.dumps(group_row(g), ensure_ascii=False) + "\n")
  os.replace(tmp, path)
