"""Preference pairs with segment x aspect scores (HelpSteer-2D) and their readers.

HelpSteer-2D JSONL (one pair per line):
  {"prompt", "chosen", "rejected",
   "chosen_segments": [{"text": ..., "scores": {aspect: value, ...}}, ...],
   "rejected_segments": [...]}
The segments' texts must tile their response exactly (concatenated in order
they give the response) and every segment must score every configured
aspect in [0, score_max].

CSV (the public 2D-DPO code's form): columns `instruction, chosen, rejected,
chosen segment scores, rejected segment scores`, the scores one
already-aggregated value per segment as a list string ("[3, 4, 2]"). The
segments are the sentence segmenter's; the number of scores must equal the
number of segments. The pair then has one aspect, `score`.

Plain pairs for building 2D data: JSONL rows with prompt/chosen/rejected,
HelpSteer2 preference rows (response_1, response_2, preference_strength <
0 means response_1 is preferred), or HelpSteer2 rows (two responses per
prompt, consecutive): the higher helpfulness is chosen, ties are skipped.

Bad rows raise `DataError(file, line, why)` or are skipped and counted
(`on_bad_record="skip"`), as in `rows`.
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import json
import os
import sys
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from helpsteer_jax.data import segment
from helpsteer_jax.data.formats.helpsteer import helpsteer_fields
from helpsteer_jax.data.formats.rows import (
  BadRecord,
  BadRecordReport,
  iter_checked_rows,
  iter_json_lines,
  iter_rows,
  log,
  required,
  required_text,
  resolve_source,
  row_numbered,
)
from helpsteer_jax.data.records import ASPECTS_2D
from helpsteer_jax.errors import ConfigError, DataError

CSV_COLUMNS = ("instruction", "chosen", "rejected", "chosen segment scores",
               "rejected segment scores")
CSV_ASPECTS = ("score",)


@dataclasses.dataclass(frozen=True)
class ScoredResponse:
  """A response, its segments (tiling `text`) and their scores [S, A]."""
  text: str
  segments: tuple[str, ...]
  scores: np.ndarray


@dataclasses.dataclass(frozen=True)
class ScoredPair:
  prompt: str
  chosen: ScoredResponse
  rejected: ScoredResponse
  source: str = ""


@dataclasses.dataclass(frozen=True)
class PlainPair:
  prompt: str
  chosen: str
  rejected: str
  source: str = ""


def _number(value: Any, what: str, score_max: float) -> float:
  if (isinstance(value, (bool, np.bool_))
      or not isinstance(value, (int, float, np.integer, np.floating))):
    raise BadRecord("score not a number", f"{what}={value!r}")
  if not 0 <= value <= score_max or value != value:
    raise BadRecord(f"score outside 0..{score_max:g}", f"{what}={value}")
  return float(value)


def _segments_2d(row: Mapping, side: str, aspects: Sequence[str],
                 score_max: float) -> ScoredResponse:
  text = required_text(row, side)
  segs = required(row, f"{side}_segments")
  if not isinstance(segs, list) or not segs:
    raise BadRecord(f"'{side}_segments' is not a non-empty list", type(segs).__name__)
  texts, scores = [], []
  for k, seg in enumerate(segs):
    if not isinstance(seg, Mapping) or not isinstance(seg.get("text"), str):
      raise BadRecord("segment without text", f"{side}_segments[{k}]")
    values = seg.get("scores")
    if not isinstance(values, Mapping):
      raise BadRecord("segment without scores", f"{side}_segments[{k}]")
    missing = [a for a in aspects if a not in values]
    if missing:
      raise BadRecord("segment misses aspects", f"{side}_segments[{k}] has no {missing}")
    texts.append(seg["text"])
    scores.append([_number(values[a], f"{side}_segments[{k}].{a}", score_max) for a in aspects])
  if segment.spans_of(text, texts) is None:
    raise BadRecord("segments do not tile the response",
                    f"the {len(texts)} '{side}_segments' texts joined differ from '{side}'")
  return ScoredResponse(text, tuple(texts), np.asarray(scores, np.float32))


def _whole(row: Mapping, side: str, aspects: Sequence[str]) -> ScoredResponse:
  text = required(row, side)
  if not isinstance(text, str):  # an empty answer is still an answer (its end of turn)
    raise BadRecord(f"{side!r} is not a string", type(text).__name__)
  return ScoredResponse(text, (text,), np.zeros((1, len(aspects)), np.float32))


def _row_2d(aspects: Sequence[str], score_max: float, whole_responses: bool = False):
  def check(row: Any, where: str) -> ScoredPair:
    if not isinstance(row, Mapping):
      raise BadRecord("not a JSON object", type(row).__name__)
    prompt = required_text(row, "prompt")
    if whole_responses and "chosen_segments" not in row and "rejected_segments" not in row:
      return ScoredPair(prompt, _whole(row, "chosen", aspects),
                        _whole(row, "rejected", aspects), where)
    return ScoredPair(prompt, _segments_2d(row, "chosen", aspects, score_max),
                          _segments_2d(row, "rejected", aspects, score_max), where)
  return check


def _score_list(row: Mapping, column: str, text: str, score_max: float) -> ScoredResponse:
  raw = row.get(column)
  if raw is None or not str(raw).strip():
    raise BadRecord(f"missing field '{column}'")
  try:
    values = ast.literal_eval(str(raw))
  except (ValueError, SyntaxError):
    raise BadRecord("malformed score list", f"'{column}' is {str(raw)[:60]!r}") from None
  if not isinstance(values, (list, tuple)):
    raise BadRecord("malformed score list", f"'{column}' is not a list")
  scores = [_number(v, f"{column}[{k}]", score_max) for k, v in enumerate(values)]
  segs = segment.segment_texts(text)
  if len(scores) != len(segs):
    raise BadRecord("score count differs from segment count",
                    f"'{column}' has {len(scores)} scores, the response has {len(segs)} segments")
  return ScoredResponse(text, tuple(segs), np.asarray(scores, np.float32)[:, None])


def _row_csv(score_max: float):
  def check(row: Any, where: str) -> ScoredPair:
    prompt = required_text(row, "instruction")
    chosen, rejected = required_text(row, "chosen"), required_text(row, "rejected")
    return ScoredPair(prompt, _score_list(row, "chosen segment scores", chosen, score_max),
                          _score_list(row, "rejected segment scores", rejected, score_max), where)
  return check


def iter_csv_rows(path: str) -> Iterator[tuple[int, dict]]:
  """(line where the record starts, row dict); a missing column is a DataError,
  and so is text that is not UTF-8 or not CSV (naming the line)."""
  csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long responses are legitimate
  line = 1
  try:
    with open(path, newline="", encoding="utf-8") as f:
      reader = csv.DictReader(f)
      missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
      if missing:
        raise DataError(path, 1, f"CSV header lacks column(s) {missing}; "
                                 f"expected {list(CSV_COLUMNS)}")
      line = reader.line_num + 1
      for row in reader:
        yield line, row
        line = reader.line_num + 1
  except (UnicodeDecodeError, csv.Error) as e:
    raise DataError(path, line, f"unreadable CSV ({type(e).__name__}: {e}); the file must be"
                    " UTF-8 CSV with a header row") from None


def read_2d(path: str | os.PathLike, aspects: Sequence[str] = ASPECTS_2D, score_max: float = 4.0,
            on_bad_record: str = "error", report: BadRecordReport | None = None,
            whole_responses: bool = False) -> list[ScoredPair]:
  """HelpSteer-2D pairs from `.jsonl` / `.jsonl.gz` or `.csv` (one `score` aspect).

  `whole_responses` (the sequence-level losses, which read no segment scores) also
  takes plain `prompt` / `chosen` / `rejected` rows (TRL's format), each response one
  unscored segment."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ConfigError(f"{path} does not exist (expected a HelpSteer-2D .jsonl or .csv file)")
  if path.endswith(".csv"):
    rows, check = iter_csv_rows(path), _row_csv(score_max)
  elif path.endswith((".jsonl", ".jsonl.gz")):
    rows, check = iter_json_lines(path), _row_2d(tuple(aspects), score_max, whole_responses)
  else:
    raise ConfigError(f"{path}: unsupported file type for 2D data; use .jsonl, .jsonl.gz or .csv")
  return [p for _, p in iter_checked_rows(rows, path, check, on_bad_record, report)]


def write_2d(path: str | os.PathLike, pairs: Sequence[ScoredPair],
             aspects: Sequence[str]) -> None:
  """HelpSteer-2D JSONL (written to a temporary file, then renamed)."""
  tmp = f"{os.fspath(path)}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for pair in pairs:
      row = {"prompt": pair.prompt, "chosen": pair.chosen.text, "rejected": pair.rejected.text}
      for side, resp in (("chosen", pair.chosen), ("rejected", pair.rejected)):
        row[f"{side}_segments"] = [
            {"text": t, "scores": {a: round(float(v), 4) for a, v in zip(aspects, s)}}
            for t, s in zip(resp.segments, resp.scores)]
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
  os.replace(tmp, path)


# ---------------------------------------------------------------- plain pairs


def _plain_row(row: Any, where: str) -> PlainPair:
  if not isinstance(row, Mapping):
    raise BadRecord("not a JSON object", type(row).__name__)
  prompt = required_text(row, "prompt")
  if "chosen" in row or "rejected" in row:
    return PlainPair(prompt, required_text(row, "chosen"), required_text(row, "rejected"), where)
  a, b = required_text(row, "response_1"), required_text(row, "response_2")
  strength = required(row, "preference_strength")
  if isinstance(strength, bool) or not isinstance(strength, (int, float)):
    raise BadRecord("preference_strength not a number", repr(strength))
  if strength == 0:
    raise BadRecord("no preference", "preference_strength is 0")
  return PlainPair(prompt, a, b, where) if strength < 0 else PlainPair(prompt, b, a, where)


def read_plain_pairs(source: str | os.PathLike, split: str = "train", on_bad_record: str = "error",
                     report: BadRecordReport | None = None) -> list[PlainPair]:
  """Pairs from prompt/chosen/rejected rows, HelpSteer2 preference rows or HelpSteer2 rows."""
  kind, location = resolve_source(source, split)
  rows = list(iter_rows(kind, location, split))
  first = next((r for _, r in rows if isinstance(r, Mapping)), {})
  if "response" in first and "chosen" not in first:
    return _pairs_from_ratings(rows, location, on_bad_record, report)
  return [p for _, p in iter_checked_rows(rows, location, _plain_row, on_bad_record,
                                                  report, by_row=row_numbered(kind))]


def _pairs_from_ratings(rows, location, on_bad_record, report) -> list[PlainPair]:
  """HelpSteer2 rows: responses to the same (consecutive) prompt, ranked by helpfulness."""
  checked = iter_checked_rows(rows, location, lambda r, w: helpsteer_fields(r),
                                      on_bad_record, report)
  groups: list[list[tuple[int, str, str, int]]] = []
  for line, (prompt, response, scores) in checked:
    if groups and groups[-1][0][1] == prompt:
      groups[-1].append((line, prompt, response, scores["helpfulness"]))
    else:
      groups.append([(line, prompt, response, scores["helpfulness"])])
  pairs, ties = [], 0
  for group in groups:
    ranked = sorted(group, key=lambda g: -g[3])
    if len(ranked) < 2 or ranked[0][3] == ranked[-1][3]:
      ties += len(ranked) >= 2
      continue
    best, worst = ranked[0], ranked[-1]
    pairs.append(PlainPair(best[1], best[2], worst[2], f"{location}:{best[0]}"))
  if ties:
    log.info("%s: %d prompt(s) without a helpfulness difference were not paired",
                     location, ties)
  return pairs
