"""Readers for preference pairs: HelpSteer2-Preference and RewardBench files.

HelpSteer2's `preference/preference.jsonl.gz` rows hold `split`, `prompt`,
`response_1`, `response_2` and `preference_strength` (an int in -3..3;
negative means response 1 is better, 0 is a tie). RewardBench files
(`allenai/reward-bench`) hold `prompt`, `chosen`, `rejected` and `subset`.
Sources and bad rows are handled as in `rows`: a bad row raises
`DataError(path, line, reason)` or, with on_bad_record="skip", is counted in
a `BadRecordReport`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

import numpy as np

from helpsteer_jax.data.formats.rows import (
  BadRecord,
  BadRecordReport,
  read_checked,
  required_text,
  resolve_source,
)
from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.data.template import DEFAULT_SYSTEM, split_helpsteer_prompt

MAX_STRENGTH = 3
HELPSTEER2_PREFERENCE_FILES = ("preference/preference.jsonl.gz", "preference.jsonl.gz",
                               "preference/preference.jsonl", "preference.jsonl")


@dataclasses.dataclass(frozen=True)
class PreferencePair:
  """Two responses to one prompt, the better one first.

  `strength` is |preference_strength| (0 = tie; RewardBench pairs are 1).
  `subset` is the RewardBench subset (or the HelpSteer2 split).
  """
  chosen: Conversation
  rejected: Conversation
  strength: int = 1
  subset: str = ""
  source: str = ""


def with_response(prompt: str, response: str, source: str) -> Conversation:
  """A prompt (HelpSteer2's multi-turn markers split into turns, a plain string one user
  turn) answered by `response`, under the default system prompt."""
  turns = (*split_helpsteer_prompt(prompt), Turn("Assistant", response))
  return Conversation(system=DEFAULT_SYSTEM, turns=turns, source=source)


def _strength(row: Mapping) -> int:
  value = row.get("preference_strength")
  if value is None:
    raise BadRecord("missing field 'preference_strength'")
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise BadRecord("preference_strength not an integer", f"preference_strength={value!r}")
  if not -MAX_STRENGTH <= value <= MAX_STRENGTH:
    raise BadRecord(f"preference_strength outside -{MAX_STRENGTH}..{MAX_STRENGTH}",
                    f"preference_strength={value}")
  return int(value)


def helpsteer2_pair(row: Mapping, where: str) -> PreferencePair:
  """A HelpSteer2-Preference row as a pair (response 1 first when strength <= 0)."""
  if not isinstance(row, Mapping):
    raise BadRecord("not a JSON object", type(row).__name__)
  prompt = required_text(row, "prompt")
  one, two = required_text(row, "response_1"), required_text(row, "response_2")
  strength = _strength(row)
  chosen, rejected = (one, two) if strength <= 0 else (two, one)
  split = row.get("split") if isinstance(row.get("split"), str) else ""
  return PreferencePair(with_response(prompt, chosen, where),
                        with_response(prompt, rejected, where),
                        strength=abs(strength), subset=split, source=where)


def rewardbench_pair(row: Mapping, where: str) -> PreferencePair:
  """A RewardBench row (`prompt`, `chosen`, `rejected`, `subset`) as a pair."""
  if not isinstance(row, Mapping):
    raise BadRecord("not a JSON object", type(row).__name__)
  prompt, subset = required_text(row, "prompt"), required_text(row, "subset")
  chosen, rejected = required_text(row, "chosen"), required_text(row, "rejected")
  return PreferencePair(with_response(prompt, chosen, where),
                        with_response(prompt, rejected, where), strength=1,
                        subset=subset, source=where)


def _resolve_preference(source: str | os.PathLike, split: str) -> tuple[str, str]:
  path = os.path.expanduser(os.fspath(source))
  if os.path.isdir(path):
    for name in HELPSTEER2_PREFERENCE_FILES:
      if os.path.isfile(os.path.join(path, name)):
        return resolve_source(os.path.join(path, name))
  return resolve_source(path, split)


def read_helpsteer2_preference(source: str | os.PathLike, split: str | None = None,
                               on_bad_record: str = "error",
                               report: BadRecordReport | None = None) -> list[PreferencePair]:
  """Pairs from HelpSteer2's preference file (or a directory holding it).

  `split` keeps the rows whose `split` field matches ("train" or
  "validation"); None keeps all. Ties (strength 0) are kept: training drops
  them, evaluation does not count them.
  """
  kind, location = _resolve_preference(source, split or "train")
  pairs = read_checked(kind, location, split or "train", helpsteer2_pair, on_bad_record, report)
  if split:
    pairs = [p for p in pairs if p.subset in ("", split)]
  return pairs


def read_rewardbench(source: str | os.PathLike, split: str = "filtered",
                     on_bad_record: str = "error",
                     report: BadRecordReport | None = None) -> list[PreferencePair]:
  """Pairs from a RewardBench file (jsonl / parquet) or directory (`{split}.*`)."""
  kind, location = resolve_source(source, split)
  return read_checked(kind, location, split, rewardbench_pair, on_bad_record, report)
