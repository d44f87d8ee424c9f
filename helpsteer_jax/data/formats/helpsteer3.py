"""Readers for HelpSteer3 as the hub ships it: `<config>/{train,validation}.jsonl.gz`.

Every config's rows hold `domain`, `language` and `context`, a list of
{role, content} messages (user and assistant turns; a leading system message is the
conversation's system prompt). The configs' own fields (nvidia/HelpSteer3's card):

- preference: `response1`, `response2`, `overall_preference` (-3..3, negative: response
  1 is better, 0 a tie) and `individual_preference` (a list of {score, reasoning});
- feedback: `response1`, `response2`, `feedback1`, `feedback2`: lists of annotators'
  strings that start "The response is {not, slightly, partially, mostly, perfectly}
  helpful";
- edit: `original_response`, `edited_response`, `feedback` and `change_summary`;
- edit_quality: `original_response`, `good_edited_response`, `bad_edited_response`;
- principle: `response`, `principle`, `fulfilment` ("Yes" or "No").

The context's earlier assistant turns are context only (`trainable=False`); the rows'
responses answer its last user turn, and a task renders the conversation with the
model's chat template. `domains` and `languages` keep only the rows whose field is
listed. A bad row raises `DataError(path, line, reason)` or is skipped and counted
(`rows`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable, Mapping, Sequence

from helpsteer_jax.data.formats.preference import MAX_STRENGTH, PreferencePair
from helpsteer_jax.data.formats.rows import (
  BadRecord,
  BadRecordReport,
  iter_checked_rows,
  iter_rows,
  required,
  required_text,
  resolve_source,
  row_numbered,
)
from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.errors import ConfigError

CONFIGS = ("preference", "feedback", "edit", "edit_quality", "principle")
# "The response is <level> helpful": the 1-5 helpfulness a feedback string states
HELPFULNESS_LEVELS = {"not": 1, "slightly": 2, "partially": 3, "mostly": 4, "perfectly": 5}
_LEVEL = re.compile(r"\s*the response is (not|slightly|partially|mostly|perfectly) helpful",
                    re.IGNORECASE)
_ROLES = {"user": "User", "assistant": "Assistant"}


@dataclasses.dataclass(frozen=True)
class Context:
  """A row's conversation before its responses, with its domain and language."""
  conversation: Conversation
  domain: str
  language: str

  def answered(self, response: str) -> Conversation:
    return self.conversation.answered(response)


@dataclasses.dataclass(frozen=True)
class Record:
  """What every config's record holds: its context; `source` is its file and line."""
  context: Context

  @property
  def source(self) -> str:
    return self.context.conversation.source


@dataclasses.dataclass(frozen=True)
class Feedback(Record):
  """Two responses and each one's annotators' feedback; `helpfulness` [2] is the mean of
  the levels the feedback states (None where no string states one)."""
  responses: tuple[str, str]
  feedback: tuple[tuple[str, ...], tuple[str, ...]]
  helpfulness: tuple[float | None, float | None]


@dataclasses.dataclass(frozen=True)
class Edit(Record):
  """A response, the feedback on it and its annotator's edit."""
  original: str
  edited: str
  feedback: tuple[str, ...]
  change_summary: str


@dataclasses.dataclass(frozen=True)
class EditQuality(Record):
  """A response's good and bad edits; as a pair, the good one first."""
  original: str
  good: str
  bad: str

  @property
  def pair(self) -> PreferencePair:
    return PreferencePair(self.context.answered(self.good), self.context.answered(self.bad),
                          strength=1, subset=self.context.domain, source=self.source)


@dataclasses.dataclass(frozen=True)
class Principle(Record):
  """A response and a principle it fulfils or not (RLBFF's yes/no judgement)."""
  response: str
  principle: str
  fulfilled: bool


@dataclasses.dataclass(frozen=True)
class Preference(Record):
  """A preference row: both responses in order, `overall_preference` and, as a pair for
  the Bradley-Terry path, the better one first (`pair`, strength |overall_preference|)."""
  responses: tuple[str, str]
  overall: int
  individual: tuple[int, ...]

  @property
  def pair(self) -> PreferencePair:
    one, two = (self.context.answered(r) for r in self.responses)
    chosen, rejected = (one, two) if self.overall <= 0 else (two, one)
    return PreferencePair(chosen, rejected, strength=abs(self.overall),
                          subset=self.context.domain, source=self.source)


def context(row: Mapping, where: str = "") -> Context:
  """The row's `context` messages, `domain` and `language`."""
  if not isinstance(row, Mapping):
    raise BadRecord("not a JSON object", type(row).__name__)
  messages = required(row, "context")
  if not isinstance(messages, (list, tuple)) or not messages:
    raise BadRecord("context is not a non-empty list of messages", repr(messages)[:80])
  system, turns = "", []
  for j, message in enumerate(messages):
    if not isinstance(message, Mapping):
      raise BadRecord(f"context[{j}] is not a {{role, content}} object", repr(message)[:80])
    role, text = message.get("role"), message.get("content")
    if not isinstance(text, str):
      raise BadRecord(f"context[{j}].content is not a string", repr(text)[:80])
    if role == "system" and j == 0:
      system = text
      continue
    if role not in _ROLES:
      raise BadRecord(f"context[{j}].role must be user or assistant", repr(role))
    turns.append(Turn(_ROLES[role], text, trainable=role != "assistant"))
  if not turns or turns[-1].role != "User":
    raise BadRecord("context does not end with a user turn",
                    f"{len(turns)} turns, the last {turns[-1].role if turns else None}")
  domain, language = (row.get(k) if isinstance(row.get(k), str) else ""
                      for k in ("domain", "language"))
  return Context(Conversation(system=system, turns=tuple(turns), source=where),
                 domain, language)


def helpfulness(feedback: Sequence[str]) -> float | None:
  """The mean 1-5 level the strings state ("The response is mostly helpful..."), None
  where none states one."""
  levels = [HELPFULNESS_LEVELS[m.group(1).lower()] for m in map(_LEVEL.match, feedback) if m]
  return sum(levels) / len(levels) if levels else None


def _strings(row: Mapping, name: str) -> tuple[str, ...]:
  value = required(row, name)
  if isinstance(value, str):
    value = [value]
  if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
    raise BadRecord(f"{name} is not a list of strings", repr(value)[:80])
  return tuple(value)


def _preference(row: Mapping, where: str) -> Preference:
  ctx = context(row, where)
  value = required(row, "overall_preference")
  if isinstance(value, bool) or not isinstance(value, int):
    raise BadRecord("overall_preference is not an integer", f"overall_preference={value!r}")
  if not -MAX_STRENGTH <= value <= MAX_STRENGTH:
    raise BadRecord(f"overall_preference outside -{MAX_STRENGTH}..{MAX_STRENGTH}",
                    f"overall_preference={value}")
  individual = row.get("individual_preference") or []
  if not isinstance(individual, list) or not all(
      isinstance(p, Mapping) and isinstance(p.get("score"), int) for p in individual):
    raise BadRecord("individual_preference is not a list of {score, reasoning}",
                    repr(individual)[:80])
  return Preference(ctx, (required_text(row, "response1"), required_text(row, "response2")),
                    value, tuple(int(p["score"]) for p in individual))


def _feedback(row: Mapping, where: str) -> Feedback:
  ctx = context(row, where)
  one, two = _strings(row, "feedback1"), _strings(row, "feedback2")
  return Feedback(ctx, (required_text(row, "response1"), required_text(row, "response2")),
                  (one, two), (helpfulness(one), helpfulness(two)))


def _edit(row: Mapping, where: str) -> Edit:
  summary = row.get("change_summary")
  return Edit(context(row, where), required_text(row, "original_response"),
              required_text(row, "edited_response"), _strings(row, "feedback"),
              summary if isinstance(summary, str) else "")


def _edit_quality(row: Mapping, where: str) -> EditQuality:
  return EditQuality(context(row, where), required_text(row, "original_response"),
                     required_text(row, "good_edited_response"),
                     required_text(row, "bad_edited_response"))


def _principle(row: Mapping, where: str) -> Principle:
  ctx = context(row, where)
  verdict = required_text(row, "fulfilment").strip()
  if verdict not in ("Yes", "No"):
    raise BadRecord("fulfilment is neither Yes nor No", repr(verdict))
  return Principle(ctx, required_text(row, "response"), required_text(row, "principle"),
                   verdict == "Yes")


READERS: dict[str, Callable[[Mapping, str], Any]] = {
    "preference": _preference, "feedback": _feedback, "edit": _edit,
    "edit_quality": _edit_quality, "principle": _principle}


def read_helpsteer3(source: str | os.PathLike, config: str, split: str = "train", *,
                    domains: Sequence[str] = (), languages: Sequence[str] = (),
                    on_bad_record: str = "error",
                    report: BadRecordReport | None = None) -> list:
  """`config`'s records from `source`: the dataset's directory (holding
  `<config>/<split>.jsonl.gz`), the config's directory, or one file.

  preference -> `Preference`, feedback -> `Feedback`, edit -> `Edit`, edit_quality ->
  `EditQuality`, principle -> `Principle`."""
  if config not in READERS:
    raise ConfigError(f"HelpSteer3 config {config!r}: expected one of {', '.join(CONFIGS)}")
  path = os.path.expanduser(os.fspath(source))
  if os.path.isdir(os.path.join(path, config)):
    path = os.path.join(path, config)
  kind, location = resolve_source(path, split)
  checked = iter_checked_rows(iter_rows(kind, location, split), location, READERS[config],
                              on_bad_record, report, by_row=row_numbered(kind))
  return [record for _, record in checked
          if (not domains or record.context.domain in domains)
          and (not languages or record.context.language in languages)]


def read_preference_pairs(source: str | os.PathLike, split: str = "train", *,
                          domains: Sequence[str] = (), languages: Sequence[str] = (),
                          on_bad_record: str = "error",
                          report: BadRecordReport | None = None) -> list[PreferencePair]:
  """The preference config's rows as Bradley-Terry pairs: the better response first,
  strength |overall_preference|. Ties are kept (strength 0): training drops them,
  evaluation does not count them, as for HelpSteer2-Preference."""
  return [r.pair for r in read_helpsteer3(source, "preference", split, domains=domains,
                                          languages=languages, on_bad_record=on_bad_record,
                                          report=report)]


def filter_list(text: str) -> tuple[str, ...]:
  """A config's comma-separated `domains` / `languages` ("" = keep every row)."""
  return tuple(v.strip() for v in text.split(",") if v.strip())
