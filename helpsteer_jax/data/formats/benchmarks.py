"""Readers for the reward-model benchmarks, as their authors release them.

- RM-Bench (THU-KEG/RM-Bench, `data/total_dataset.json`: one JSON list; JSONL also read):
  `{id, prompt, chosen: [3], rejected: [3], domain}`; the responses are, in order,
  concise, detailed plain text and detailed markdown. The domain is one of RM-Bench's
  four by its prefix, as its `split_dataset_by_domain` does ("safety-refuse" and
  "safety-response" are safety).
- JudgeBench (ScalerLab/JudgeBench, `data/dataset=judgebench,response_model=*.jsonl`):
  `{pair_id, original_id, source, question, response_A, response_B, label}`, label "A>B"
  or "B>A". The category is the source's prefix, as its `run_judge.py` groups them
  (mmlu-pro: knowledge, livebench-reasoning: reasoning, livebench-math: math,
  livecodebench: coding).
- RewardBench 2 (allenai/reward-bench-2, `data/test-*.parquet`; JSONL also read): `{id,
  prompt, chosen: [..], rejected: [..], subset, num_correct}`; the completions are
  chosen then rejected and the first `num_correct` are correct (default: the chosen).
  A Ties row's id is "ref:<n>" or "tied:<n>", the reference and the tied prompt n.

A bad row raises `DataError(path, line, reason)` or is skipped and counted (`rows`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import numpy as np

from helpsteer_jax.data.formats.preference import with_response
from helpsteer_jax.data.formats.rows import (
  BadRecord,
  BadRecordReport,
  read_checked,
  required,
  required_text,
  resolve_source,
)
from helpsteer_jax.data.records import Conversation

RM_BENCH_DOMAINS = ("chat", "code", "math", "safety")
RM_BENCH_STYLES = 3  # concise, detailed plain, detailed markdown
JUDGEBENCH_CATEGORIES = {"knowledge": "mmlu-pro", "reasoning": "livebench-reasoning",
                         "math": "livebench-math", "coding": "livecodebench"}
JUDGEBENCH_LABELS = ("A>B", "B>A")
TIES_SUBSET = "ties"  # RewardBench 2's subset with its own score (any case)
TIES_KINDS = ("ref", "tied")


@dataclasses.dataclass(frozen=True)
class RMBenchRow:
  """One prompt's 3 chosen and 3 rejected responses (each [3]: concise, detailed plain,
  detailed markdown) and its RM-Bench domain (chat, code, math or safety)."""
  id: str
  domain: str
  chosen: tuple[Conversation, ...]
  rejected: tuple[Conversation, ...]
  source: str = ""

  @property
  def conversations(self) -> tuple[Conversation, ...]:
    return (*self.chosen, *self.rejected)


@dataclasses.dataclass(frozen=True)
class JudgeBenchPair:
  """Two responses to a question, A and B, and which is right (`label` "A>B" or "B>A");
  `category` is knowledge, reasoning, math, coding or "" (another source)."""
  pair_id: str
  source_name: str
  category: str
  response_a: Conversation
  response_b: Conversation
  label: str
  source: str = ""


@dataclasses.dataclass(frozen=True)
class RewardBench2Row:
  """A prompt's completions, chosen then rejected; the first `num_correct` are correct."""
  id: str
  subset: str
  completions: tuple[Conversation, ...]
  num_correct: int
  source: str = ""

  @property
  def is_ties(self) -> bool:
    return self.subset.lower() == TIES_SUBSET

  def ties_key(self) -> tuple[str, int]:
    """(kind, prompt number) of a Ties row's id "ref:<n>" / "tied:<n>"."""
    kind, _, number = self.id.partition(":")
    return kind, int(number)


def _identifier(row: Mapping, name: str) -> str:
  value = required(row, name)
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (str, int, np.integer)):
    raise BadRecord(f"wrong type for '{name}'", f"expected a string or an integer, got"
                    f" {type(value).__name__}")
  return str(value)


def _responses(row: Mapping, name: str, count: int | None = None) -> list[str]:
  """A list field of response strings (empty strings allowed: an answer may be empty)."""
  value = required(row, name)
  if isinstance(value, np.ndarray):  # parquet list columns
    value = value.tolist()
  if not isinstance(value, (list, tuple)):
    raise BadRecord(f"wrong type for '{name}'", f"expected a list of strings, got"
                    f" {type(value).__name__}")
  if not all(isinstance(v, str) for v in value):
    raise BadRecord(f"wrong type for '{name}'", "expected a list of strings")
  if count is not None and len(value) != count:
    raise BadRecord(f"'{name}' does not hold {count} responses", f"{len(value)} given")
  if not value:
    raise BadRecord(f"empty {name}", "no responses")
  return list(value)


def _object(row: Any) -> Mapping:
  if not isinstance(row, Mapping):
    raise BadRecord("not a JSON object", type(row).__name__)
  return row


def rm_bench_row(row: Any, where: str) -> RMBenchRow:
  """An RM-Bench row; its domain by RM-Bench's prefixes."""
  row = _object(row)
  prompt, domain = required_text(row, "prompt"), required_text(row, "domain")
  matched = [d for d in RM_BENCH_DOMAINS if domain.startswith(d)]
  if not matched:
    raise BadRecord("unknown RM-Bench domain", f"domain={domain!r}; expected one starting"
                    f" with {', '.join(RM_BENCH_DOMAINS)}")
  chosen = _responses(row, "chosen", RM_BENCH_STYLES)
  rejected = _responses(row, "rejected", RM_BENCH_STYLES)
  return RMBenchRow(_identifier(row, "id"), matched[0],
                    tuple(with_response(prompt, r, where) for r in chosen),
                    tuple(with_response(prompt, r, where) for r in rejected), where)


def judgebench_pair(row: Any, where: str) -> JudgeBenchPair:
  """A JudgeBench pair; its category from the source's prefix."""
  row = _object(row)
  question, source = required_text(row, "question"), required_text(row, "source")
  label = required_text(row, "label")
  if label not in JUDGEBENCH_LABELS:
    raise BadRecord("unknown JudgeBench label", f"label={label!r}; expected A>B or B>A")
  a, b = required_text(row, "response_A"), required_text(row, "response_B")
  category = next((c for c, prefix in JUDGEBENCH_CATEGORIES.items()
                   if source.startswith(prefix)), "")
  return JudgeBenchPair(_identifier(row, "pair_id"), source, category,
                        with_response(question, a, where), with_response(question, b, where),
                        label, where)


def rewardbench2_row(row: Any, where: str) -> RewardBench2Row:
  """A RewardBench 2 row (Ties rows: the id names the prompt, two correct at least)."""
  row = _object(row)
  prompt, subset = required_text(row, "prompt"), required_text(row, "subset")
  chosen, rejected = _responses(row, "chosen"), _responses(row, "rejected")
  total = len(chosen) + len(rejected)
  num_correct = row.get("num_correct", len(chosen))
  if num_correct is None:
    num_correct = len(chosen)
  if isinstance(num_correct, (bool, np.bool_)) or not isinstance(num_correct,
                                                                 (int, np.integer)):
    raise BadRecord("num_correct not an integer", f"num_correct={num_correct!r}")
  if not 1 <= num_correct < total:
    raise BadRecord("num_correct outside 1..completions-1",
                    f"num_correct={num_correct}, {total} completions")
  out = RewardBench2Row(_identifier(row, "id"), subset,
                        tuple(with_response(prompt, r, where) for r in (*chosen, *rejected)),
                        int(num_correct), where)
  if out.is_ties:
    kind, _, number = out.id.partition(":")
    if kind not in TIES_KINDS or not number.strip().lstrip("-").isdigit():
      raise BadRecord("Ties id not ref:<n> or tied:<n>", f"id={out.id!r}")
    if kind == "tied" and num_correct < 2:
      raise BadRecord("a tied Ties row needs two correct completions",
                      f"num_correct={num_correct}")
  return out


def read_rm_bench(source: str | os.PathLike, on_bad_record: str = "error",
                  report: BadRecordReport | None = None) -> list[RMBenchRow]:
  """RM-Bench rows from `total_dataset.json` (a JSON list) or a JSONL / parquet file."""
  kind, location = resolve_source(source)
  return read_checked(kind, location, "train", rm_bench_row, on_bad_record, report)


def read_judgebench(source: str | os.PathLike, on_bad_record: str = "error",
                    report: BadRecordReport | None = None) -> list[JudgeBenchPair]:
  """JudgeBench pairs from one of its `data/*.jsonl` files."""
  kind, location = resolve_source(source)
  return read_checked(kind, location, "train", judgebench_pair, on_bad_record, report)


def read_rewardbench2(source: str | os.PathLike, split: str = "test",
                      on_bad_record: str = "error",
                      report: BadRecordReport | None = None) -> list[RewardBench2Row]:
  """RewardBench 2 rows from a parquet / JSONL file or a directory holding `{split}.*`."""
  kind, location = resolve_source(source, split)
  return read_checked(kind, location, split, rewardbench2_row, on_bad_record, report)
