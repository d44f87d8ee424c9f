"""MT-Bench's files as FastChat publishes them (lm-sys/FastChat, `fastchat/llm_judge/data`).

Users download them (they are Apache-2.0, not shipped here): the 80 two-turn
questions (`mt_bench/question.jsonl`), GPT-4's reference answers for the
categories graded against a reference (`mt_bench/reference_answer/gpt-4.jsonl`)
and the judge prompts (`judge_prompts.jsonl`). Every bad row raises a
`DataError` naming its file and line.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Iterator, Mapping

from helpsteer_jax.data.formats.rows import iter_json_lines
from helpsteer_jax.errors import ConfigError, DataError

# FastChat's NEED_REF_CATS: graded with the reference answer (the *-math-* prompts).
REFERENCE_CATEGORIES = ("math", "reasoning", "coding")
SINGLE_PROMPTS = ("single-v1", "single-math-v1", "single-v1-multi-turn",
                  "single-math-v1-multi-turn")
QUESTIONS_FILE = "question.jsonl"
REFERENCE_FILES = ("reference_answer/gpt-4.jsonl", "reference_answer_gpt-4.jsonl")
PROMPTS_FILES = ("judge_prompts.jsonl", "../judge_prompts.jsonl")
DOWNLOAD_HINT = ("download FastChat's fastchat/llm_judge/data/mt_bench/question.jsonl,"
                 " mt_bench/reference_answer/gpt-4.jsonl and judge_prompts.jsonl")


@dataclasses.dataclass(frozen=True)
class Question:
  """One MT-Bench question: its user turns and, for math/reasoning/coding, the
  reference answer of each turn."""

  question_id: int
  category: str
  turns: tuple[str, ...]
  reference: tuple[str, ...] | None = None

  @property
  def needs_reference(self) -> bool:
    return self.category in REFERENCE_CATEGORIES


@dataclasses.dataclass(frozen=True)
class JudgePrompt:
  """One of FastChat's judge prompt templates."""

  name: str
  system_prompt: str
  prompt_template: str
  output_format: str


def _rows(path: pathlib.Path) -> Iterator[tuple[int, dict]]:
  if not path.is_file():
    raise ConfigError(f"{path} is not a file: {DOWNLOAD_HINT}")
  for line, row in iter_json_lines(path):
    if isinstance(row, Exception):
      raise DataError(str(path), line, f"unreadable JSON: {row}")
    if not isinstance(row, Mapping):
      raise DataError(str(path), line, f"expected a JSON object, got {type(row).__name__}")
    yield line, dict(row)


def _strings(value: Any, what: str, blank_ok: bool = False) -> tuple[str, ...]:
  """A non-empty list of strings (each non-blank unless `blank_ok`: a reference
  answer may leave a turn empty)."""
  if (not isinstance(value, list) or not value
          or not all(isinstance(t, str) and (blank_ok or t.strip()) for t in value)):
    raise ValueError(f"'{what}' must be a non-empty list of"
                     f" {'strings' if blank_ok else 'non-empty strings'}")
  return tuple(value)


def read_questions(path: str | pathlib.Path) -> list[Question]:
  """The questions of a FastChat `question.jsonl` (ids unique, turns non-empty)."""
  path = pathlib.Path(path)
  out, seen = [], set()
  for line, row in _rows(path):
    try:
      qid = row.get("question_id")
      if not isinstance(qid, int) or isinstance(qid, bool):
        raise ValueError(f"'question_id' must be an integer, got {qid!r}")
      if qid in seen:
        raise ValueError(f"question_id {qid} appears twice")
      category = row.get("category")
      if not isinstance(category, str) or not category:
        raise ValueError("missing field 'category'")
      turns = _strings(row.get("turns"), "turns")
      reference = _strings(row["reference"], "reference", True) if "reference" in row else None
    except ValueError as e:
      raise DataError(str(path), line, str(e)) from None
    seen.add(qid)
    out.append(Question(qid, category, turns, reference))
  if not out:
    raise DataError(str(path), None, "no questions")
  return out


def read_reference_answers(path: str | pathlib.Path) -> dict[int, tuple[str, ...]]:
  """question_id -> the reference turns of a FastChat model-answer file."""
  path = pathlib.Path(path)
  out = {}
  for line, row in _rows(path):
    try:
      qid = row.get("question_id")
      if not isinstance(qid, int):
        raise ValueError(f"'question_id' must be an integer, got {qid!r}")
      choices = row.get("choices")
      if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise ValueError("'choices' must be a non-empty list of {'turns': [...]} objects")
      out[qid] = _strings(choices[0].get("turns"), "choices[0].turns", True)
    except ValueError as e:
      raise DataError(str(path), line, str(e)) from None
  return out


def read_judge_prompts(path: str | pathlib.Path) -> dict[str, JudgePrompt]:
  """name -> prompt of FastChat's `judge_prompts.jsonl`; the four single-answer
  grading prompts must be there."""
  path = pathlib.Path(path)
  out = {}
  for line, row in _rows(path):
    missing = [k for k in ("name", "system_prompt", "prompt_template", "output_format")
               if not isinstance(row.get(k), str)]
    if missing:
      raise DataError(str(path), line, f"missing field(s) {', '.join(missing)}")
    out[row["name"]] = JudgePrompt(row["name"], row["system_prompt"], row["prompt_template"],
                                   row["output_format"])
  absent = [n for n in SINGLE_PROMPTS if n not in out]
  if absent:
    raise DataError(str(path), None, f"no judge prompt(s) {', '.join(absent)}: {DOWNLOAD_HINT}")
  return out


def _first_file(directory: pathlib.Path, names: tuple[str, ...]) -> str:
  found = next((directory / n for n in names if (directory / n).is_file()), None)
  return str(found.resolve()) if found else ""


@dataclasses.dataclass(frozen=True)
class MtBenchFiles:
  """Where the three files are: `dir` fills any path left empty (FastChat's
  `data/mt_bench` layout, or the three files side by side)."""

  questions: str
  reference_answers: str = ""
  judge_prompts: str = ""

  @classmethod
  def from_config(cls, cfg: Mapping[str, Any]) -> "MtBenchFiles":
    base = pathlib.Path(cfg.get("dir") or ".").expanduser()
    questions = cfg.get("questions") or (str(base / QUESTIONS_FILE) if cfg.get("dir") else "")
    if not questions:
      raise ConfigError(f"set --config.mt_bench.dir=<FastChat's data/mt_bench> or"
                        f" --config.mt_bench.questions=<question.jsonl>: {DOWNLOAD_HINT}")
    return cls(questions,
               cfg.get("reference_answers") or _first_file(base, REFERENCE_FILES),
               cfg.get("judge_prompts") or _first_file(base, PROMPTS_FILES))


def with_references(questions: list[Question], files: MtBenchFiles) -> list[Question]:
  """Questions of the reference categories get GPT-4's reference answers (FastChat's
  grading), else their own `reference` field; ConfigError when one has neither."""
  answers = read_reference_answers(files.reference_answers) if files.reference_answers else {}
  out = []
  for q in questions:
    if q.needs_reference:
      ref = answers.get(q.question_id, q.reference)
      if ref is None or len(ref) < len(q.turns):
        raise ConfigError(
            f"question {q.question_id} ({q.category}) is graded against a reference answer"
            f" but {files.reference_answers or 'no reference file'} has none for it: set"
            " --config.mt_bench.reference_answers=<mt_bench/reference_answer/gpt-4.jsonl>")
      q = dataclasses.replace(q, reference=tuple(ref))
    out.append(q)
  return out
