"""Answering MT-Bench: both turns of every question, the second seeing the model's own
first answer, in FastChat's model-answer format (plus the attributes asked for).

Questions are answered in batches (turn 1 of the batch, then turn 2); each
batch's rows are appended to `answers.jsonl` as it finishes, and a rerun
resumes from the batch it stopped in with that batch's seeds (`resume.py`),
so the file equals an uninterrupted run's. With FastChat's per-category
temperatures a batch never mixes two temperatures.
"""

from __future__ import annotations

import pathlib
import time
from typing import Mapping, Sequence

from helpsteer_jax import resume
from helpsteer_jax.data import template
from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.eval.mt_bench_data import Question
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.generator import Generator
from helpsteer_jax.inference.sampling import SamplingConfig

# FastChat's gen_model_answer temperature_config.
FASTCHAT_TEMPERATURES = {"writing": 0.7, "roleplay": 0.7, "extraction": 0.0, "math": 0.0,
                         "coding": 0.0, "reasoning": 0.0, "stem": 0.1, "humanities": 0.1}


def question_sampling(question: Question, sampling: SamplingConfig,
                      per_category: bool) -> SamplingConfig:
  """`sampling`, or FastChat's temperature for the question's category (0.7 when the
  category is not FastChat's); greedy below 1e-4 as FastChat."""
  if not per_category:
    return sampling
  temperature = FASTCHAT_TEMPERATURES.get(question.category, 0.7)
  return SamplingConfig(temperature=temperature if temperature >= 1e-4 else 0.0,
                        top_k=sampling.top_k, top_p=sampling.top_p)


def batches(questions: Sequence[Question], batch_size: int, sampling: SamplingConfig,
            per_category: bool) -> list[range]:
  """Consecutive question ranges of at most `batch_size`, one sampling config each."""
  out, start = [], 0
  for i in range(1, len(questions) + 1):
    if (i == len(questions) or i - start == batch_size
            or question_sampling(questions[i], sampling, per_category)
            != question_sampling(questions[start], sampling, per_category)):
      out.append(range(start, i))
      start = i
  return out


def conversation(question: Question, answers: Sequence[str], attributes: Mapping[str, int],
                 system: str, ask_next: bool = True) -> Conversation:
  """The exchanges answered so far, each answer labelled with the attributes it was
  asked for (as in AC-SFT data), then (`ask_next`) the next user turn."""
  label = template.label_string(attributes)
  turns = []
  for user, answer in zip(question.turns, answers):
    turns += [Turn("User", user), Turn("Assistant", answer, label)]
  if ask_next:
    turns.append(Turn("User", question.turns[len(answers)]))
  return Conversation(system, tuple(turns), mask_role="User")


def _answer_turns(generator: Generator, questions: Sequence[Question],
                  attributes: Mapping[str, int], system: str, max_new_tokens: int,
                  sampling: SamplingConfig, seed: int) -> tuple[list[list[str]], list[list[str]]]:
  answers: list[list[str]] = [[] for _ in questions]
  reasons: list[list[str]] = [[] for _ in questions]
  for turn in range(max(len(q.turns) for q in questions)):
    idx = [i for i, q in enumerate(questions) if turn < len(q.turns)]
    prompts = [template.generation_prompt(
        conversation(questions[i], answers[i], attributes, system), attributes) for i in idx]
    done = generator.complete(prompts, max_new_tokens, sampling=sampling, seed=seed + turn)
    for i, c in zip(idx, done):
      answers[i].append(steering.response_text(c.text, c.finish_reason))
      reasons[i].append(c.finish_reason)
  return answers, reasons


def _same_question(row: dict, question: Question) -> bool:
  return row.get("question_id") == question.question_id


def answer_all(generator: Generator, questions: Sequence[Question],
               attributes: Mapping[str, int], system: str, out_path: pathlib.Path, *,
               model_id: str, max_new_tokens: int, batch_size: int, sampling: SamplingConfig,
               per_category: bool, seed: int) -> int:
  """Appends the answers `out_path` lacks; returns how many rows were there already.

  A batch's seed is `seed` + its first question's index (+ the turn), so a
  resumed run samples what an uninterrupted one would.
  """
  attributes = steering.checked(attributes)
  done = resume.resume_point(out_path, questions, _same_question, "--config.output_dir")
  with resume.RowWriter(out_path) as writer:
    for rows in batches(questions, batch_size, sampling, per_category):
      if rows.stop <= done:
        continue
      batch = [questions[i] for i in rows]
      answers, reasons = _answer_turns(
          generator, batch, attributes, system, max_new_tokens,
          question_sampling(batch[0], sampling, per_category), seed + 2 * rows.start)
      writer.write(
          {"question_id": q.question_id, "category": q.category, "model_id": model_id,
           "attributes": dict(attributes), "choices": [{"index": 0, "turns": a}],
           "finish_reasons": r, "tstamp": time.time()}
          for i, q, a, r in zip(rows, batch, answers, reasons) if i >= done)
  return done
