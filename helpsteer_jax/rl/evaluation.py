"""The RL loop's greedy evaluation: the eval prompts answered and scored."""

from __future__ import annotations

import json
import pathlib
from typing import Callable, Sequence

import numpy as np

from helpsteer_jax import processes
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.engine import Engine
from helpsteer_jax.rl import rewards, rollout
from helpsteer_jax.rl.rollout import Prompt
from helpsteer_jax.scoring import rewards as scoring_rewards
from helpsteer_jax.scoring.scorer import Scorer


def evaluate(engine: Engine, prompts: Sequence[Prompt], scorer: Scorer, weights: np.ndarray,
             steer_attributes: Sequence[str], max_new_tokens: int,
             workdir: pathlib.Path, iteration: int,
             sample_and_score: Callable = rollout.sample_and_score) -> dict[str, float]:
  """Greedy answers to `prompts` (`sample_and_score`'s: single- or multi-turn), scored:
  mean reward, steering distance, length, share truncated; process 0 writes them to
  `samples/iteration_<N>.jsonl` (multi-turn: with every answer under "answers")."""
  if not prompts:
    return {}
  r, preds, _ = sample_and_score(engine, prompts, 1, max_new_tokens, scorer,
                                 temperature=0.0, pad_id=engine.pad_id)
  raw = scoring_rewards.rewards(preds, weights)
  requested = [p.request.attributes for p in prompts]
  out = {"reward": float(np.mean(raw)), "response_length": float(r.mask.sum(-1).mean()),
         "truncated": float(np.mean(~r.finished)),
         "steer_distance": float(np.mean(rewards.steering_distance(
             preds, requested, steer_attributes)))}
  if processes.is_primary():
    path = workdir / "samples" / f"iteration_{iteration:06d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      for i, (p, text, done, pred, rew) in enumerate(zip(prompts, r.texts, r.finished, preds,
                                                          raw)):
        turns = {} if r.answers is None else {"follow_ups": list(p.request.follow_ups),
                                              "answers": r.answers[i]}
        response = (steering.response_text(text, "stop" if done else "length")
                    if r.answers is None else r.answers[i][-1])
        row = p.request.output_row(response, reward=float(rew),
                                   scores=[float(x) for x in pred], **turns)
        f.write(json.dumps(row) + "\n")
  return out
