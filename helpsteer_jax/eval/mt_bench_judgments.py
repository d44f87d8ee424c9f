"""Grading MT-Bench answers: an LLM judge (FastChat's single-answer grading) or the
project's attribute model (per-attribute predictions and the weighted reward).

Both write one judgment row per (question, turn) in question order. LLM
judgments run on process 0 with `parallel` requests in flight; every reply
comes from the cache when it holds it. A request that still fails after the
client's retries is left out of the rows and reported; a rerun asks again.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Callable, Sequence

import numpy as np
import tqdm

from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.eval import mt_bench_grading
from helpsteer_jax.eval.mt_bench_answers import conversation
from helpsteer_jax.eval.mt_bench_data import JudgePrompt, Question
from helpsteer_jax.judges.client import JudgeError, JudgmentCache, OpenAIJudge
from helpsteer_jax.scoring import rewards
from helpsteer_jax.scoring.scorer import Scorer, predict


@dataclasses.dataclass
class Outcome:
  """The judgment rows, and the requests that failed (with their errors)."""

  rows: list[dict]
  failures: list[dict]
  asked: int = 0  # replies requested from the judge (not from the cache)


def _requests(questions: Sequence[Question], answers: dict[int, dict],
              prompts: dict[str, JudgePrompt]) -> list[mt_bench_grading.JudgeRequest]:
  out = []
  for q in questions:
    turns = answers[q.question_id]["choices"][0]["turns"]
    for turn in range(1, len(q.turns) + 1):
      out.append(mt_bench_grading.judge_request(q, turns, turn, prompts))
  return out


def llm_judgments(questions: Sequence[Question], answers: dict[int, dict],
                  prompts: dict[str, JudgePrompt], judge: OpenAIJudge, cache: JudgmentCache,
                  model_id: str, parallel: int = 4) -> Outcome:
  """FastChat-format judgment rows (`score` -1 when the reply has no rating)."""
  requests = _requests(questions, answers, prompts)
  keys = [judge.cache_key(r.system, r.user) for r in requests]
  todo = [i for i, k in enumerate(keys) if cache.get(k) is None]
  failures: dict[int, str] = {}

  def ask(i: int) -> None:
    r = requests[i]
    try:
      cache.put(keys[i], judge(r.system, r.user), judge_model=judge.model,
                question_id=r.question_id, turn=r.turn)
    except JudgeError as e:
      failures[i] = str(e)

  with concurrent.futures.ThreadPoolExecutor(max(1, parallel)) as pool:
    list(tqdm.tqdm(pool.map(ask, todo), total=len(todo), desc="judging", unit="judgment",
                   disable=not todo))
  rows = []
  for i, r in enumerate(requests):
    reply = cache.get(keys[i])
    if reply is None:
      continue
    rows.append({"question_id": r.question_id, "category": r.category, "model": model_id,
                 "judge": [judge.model, r.prompt_name], "user_prompt": r.user,
                 "judgment": reply, "score": mt_bench_grading.parse_rating(reply),
                 "turn": r.turn, "tstamp": time.time()})
  failed = [{"question_id": requests[i].question_id, "turn": requests[i].turn, "error": e}
            for i, e in sorted(failures.items())]
  return Outcome(rows, failed, asked=len(todo))


def attribute_judgments(questions: Sequence[Question], answers: dict[int, dict],
                        scorer: Scorer, weights: np.ndarray, system: str, model_id: str,
                        judge_name: str, on_batch: Callable[[int], None] | None = None
                        ) -> Outcome:
  """Rows with the nine predicted attributes of each answer turn and its reward
  (`weights` . predictions); run on every process (the scorer shards over the mesh)."""
  convs, keys = [], []
  for q in questions:
    row = answers[q.question_id]
    turns = row["choices"][0]["turns"]
    for turn in range(1, len(q.turns) + 1):
      convs.append(conversation(q, turns[:turn], row["attributes"], system, ask_next=False))
      keys.append((q, turn))
  preds = predict(convs, scorer, on_batch)
  reward = rewards.rewards(preds, weights)
  rows = []
  for (q, turn), p, r in zip(keys, preds, reward):
    scored = bool(np.all(np.isfinite(p)))
    rows.append({"question_id": q.question_id, "category": q.category, "model": model_id,
                 "judge": [judge_name, "attributes"], "turn": turn,
                 "attributes": {a: float(v) for a, v in zip(ATTRIBUTES, p)} if scored else None,
                 "score": float(r) if scored else mt_bench_grading.UNPARSED})
  return Outcome(rows, [])
