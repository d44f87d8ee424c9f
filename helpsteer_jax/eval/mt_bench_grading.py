"""MT-Bench single-answer grading as FastChat's `llm_judge` does it.

Turn 1 is graded with `single-v1` (`single-math-v1` with the reference answer
for math, reasoning and coding); turn 2 with the `-multi-turn` prompts, which
show the whole two-turn conversation and ask about the second answer. The
judge's reply carries its rating as `[[7]]` (FastChat falls back to `[7]`); a
reply without one is *unparsed*: FastChat records -1 and leaves it out of the
means, and so do we, reporting how many there were.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Sequence

from helpsteer_jax.eval.mt_bench_data import JudgePrompt, Question

UNPARSED = -1.0
# FastChat's one_score_pattern and one_score_pattern_backup.
_RATING = re.compile(r"\[\[(\d+\.?\d*)\]\]")
_RATING_BACKUP = re.compile(r"\[(\d+\.?\d*)\]")


def prompt_name(question: Question, turn: int) -> str:
  """FastChat's judge prompt for `turn` (1 or 2) of `question`."""
  math = "-math" if question.needs_reference else ""
  return f"single{math}-v1" + ("-multi-turn" if turn == 2 else "")


@dataclasses.dataclass(frozen=True)
class JudgeRequest:
  """One grading: the prompt FastChat's judge sees for one turn of one answer."""

  question_id: int
  category: str
  turn: int
  prompt_name: str
  system: str
  user: str


def judge_request(question: Question, answers: Sequence[str], turn: int,
                  prompts: dict[str, JudgePrompt]) -> JudgeRequest:
  """The grading request of `turn` for a model's `answers` (its turns) to `question`."""
  name = prompt_name(question, turn)
  prompt = prompts[name]
  refs = {}
  if question.needs_reference:
    refs["ref_answer_1"] = question.reference[0]
    if turn == 2:
      refs["ref_answer_2"] = question.reference[1]
  if turn == 2:
    user = prompt.prompt_template.format(
        question_1=question.turns[0], question_2=question.turns[1], answer_1=answers[0],
        answer_2=answers[1], **refs)
  else:
    user = prompt.prompt_template.format(question=question.turns[0], answer=answers[0], **refs)
  return JudgeRequest(question.question_id, question.category, turn, name,
                      prompt.system_prompt, user)


def parse_rating(judgment: str) -> float:
  """The `[[rating]]` in a judge's reply (FastChat's parsing), else `UNPARSED`."""
  match = _RATING.search(judgment) or _RATING_BACKUP.search(judgment)
  if not match:
    return UNPARSED
  return float(ast.literal_eval(match.group(1)))
