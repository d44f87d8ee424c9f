"""The RL loop's greedy evaluation: the eval prompts answered and scored.

What it reports follows from what the scorer is. Every run: the mean reward, the answers'
length and the share cut at the token limit. A policy scored by an attribute model: the
steering distance, where steering is requested (`reward.steer_coef`, or prompts asking
for attribute values). A judge being trained (GenRM with `scorer.source=genrm_verifier`,
the principle RM with `principle_verifier`): the share of answers its verifier could not
read (`parse_failures`; no steering distance: a judge's reward is one number in the
reward slot, not attribute predictions).
"""

from __future__ import annotations

import json
import pathlib
from typing import Callable, Sequence

import ml_collections
import numpy as np

from helpsteer_jax import processes
from helpsteer_jax.inference import steering
from helpsteer_jax.judges import genrm, principle
from helpsteer_jax.rl import rewards, rollout
from helpsteer_jax.rl.rollout import Prompt
from helpsteer_jax.scoring import genrm as genrm_scoring
from helpsteer_jax.scoring import principle_verifier
from helpsteer_jax.scoring import rewards as scoring_rewards
from helpsteer_jax.scoring.scorer import Scorer


def _genrm_unparsed(text: str) -> bool:
  """The GenRM verifier's parse failure (`judges.genrm.verifier_reward`'s -100)."""
  judged = genrm.parse(text)
  return judged is None or not judged.complete


def _principle_unparsed(text: str) -> bool:
  """An answer without a `Final Judgement: Yes` / `No` (the verifier's penalty)."""
  return principle.parse_judgement(text) is None


# The judges trained by RL, by scorer source: what their verifier cannot read.
UNPARSED: dict[str, Callable[[str], bool]] = {
    genrm_scoring.VERIFIER: _genrm_unparsed,
    principle_verifier.VERIFIER: _principle_unparsed,
}


def judge_of(scorer: ml_collections.ConfigDict) -> str:
  """The scorer source of a judge being trained (a key of `UNPARSED`), else ""."""
  return scorer.source if scorer.source in UNPARSED and not scorer.get("judge") else ""


def parse_failures(judge: str, texts: Sequence[str]) -> float:
  """The share of `texts` (a judge's answers) that `judge`'s verifier cannot read."""
  return float(np.mean([UNPARSED[judge](t) for t in texts])) if texts else 0.0


def steering_requested(steer_coef: float, prompts: Sequence[Prompt]) -> bool:
  """Whether a run steers: a steering term in the reward, or prompts asking for values."""
  return bool(steer_coef) or any(p.request.attributes for p in prompts)


def reported(judge: str, steering_on: bool) -> tuple[str, ...]:
  """The names `evaluate` reports (`judge`: `judge_of`'s; `steering_on`:
  `steering_requested`'s)."""
  return ("reward", "response_length", "truncated") + (
      ("parse_failures",) if judge else ("steer_distance",) if steering_on else ())


def evaluate(engine, prompts: Sequence[Prompt], scorer: Scorer, weights: np.ndarray,
             steer_attributes: Sequence[str], max_new_tokens: int,
             workdir: pathlib.Path, iteration: int,
             sample_and_score: Callable = rollout.sample_and_score, judge: str = "",
             steering_on: bool = True) -> dict[str, float]:
  """Greedy answers to `prompts` (`sample_and_score`'s: single- or multi-turn), scored:
  `reported(judge, steering_on)`; process 0 writes them to
  `samples/iteration_<N>.jsonl` (multi-turn: with every answer under "answers")."""
  if not prompts:
    return {}
  r, preds, _ = sample_and_score(engine, prompts, 1, max_new_tokens, scorer,
                                 temperature=0.0, pad_id=engine.pad_id)
  raw = scoring_rewards.rewards(preds, weights)
  requested = [p.request.attributes for p in prompts]
  out = {"reward": float(np.mean(raw)), "response_length": float(r.mask.sum(-1).mean()),
         "truncated": float(np.mean(~r.finished))}
  if judge:
    out["parse_failures"] = parse_failures(judge, final_answers(r))
  elif steering_on:
    out["steer_distance"] = float(np.mean(rewards.steering_distance(
        preds, requested, steer_attributes)))
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


def final_answers(r: rollout.Rollouts) -> list[str]:
  """Each completion's last answer (the one a scorer judges)."""
  return list(r.texts) if r.answers is None else [a[-1] for a in r.answers]
