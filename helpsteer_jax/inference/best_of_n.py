"""Best-of-n: sample n responses, score them with an attribute model, keep the best.

The scorer is an `attribute_scorer.AttributeScorer` (texts in NeMo's
regression format -> [n, 9]), named by `config.best_of_n.scorer` and loaded
with `attribute_scorer.load_scorer` (called with `best_of_n.scorer_path`), or
the project's attribute model (`attribute_model`: an HF sequence-classification
directory or an attribute-model workdir in `scorer_path`, on the mesh).
The reward is the weighted sum of the nine predictions; the default weights
are HelpSteer2's (helpfulness 0.65, correctness 0.8, coherence 0.45,
complexity 0.55, verbosity -0.4). With several processes, each scores its
contiguous share of the candidates and the scores are gathered.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from helpsteer_jax import multihost
from helpsteer_jax.data import template
from helpsteer_jax.data.records import ATTRIBUTES, Conversation
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.attribute_scorer import (
  AttributeScorer,
  checked_predictions,
  is_collective,
)
from helpsteer_jax.inference.generator import Generator
from helpsteer_jax.inference.sampling import SamplingConfig

HELPSTEER2_WEIGHTS = {"helpfulness": 0.65, "correctness": 0.8, "coherence": 0.45,
                      "complexity": 0.55, "verbosity": -0.4}


def weight_vector(weights: Mapping[str, float]) -> np.ndarray:
  """[9] reward weights from a name -> weight mapping (missing names weigh 0)."""
  unknown = sorted(set(weights) - set(ATTRIBUTES))
  if unknown:
    raise ConfigError(f"reward weights name unknown attribute(s) {unknown}; known:"
                      f" {', '.join(ATTRIBUTES)}")
  return np.asarray([float(weights.get(name, 0.0)) for name in ATTRIBUTES])


def scoring_text(conversation: Conversation, response: str) -> str:
  """The attribute model's input for `response` after `conversation`."""
  return template.regression_text(conversation.answered(response))


@dataclasses.dataclass
class Candidate:
  response: str
  finish_reason: str
  scores: dict[str, float]
  reward: float


@dataclasses.dataclass
class BestOfN:
  best: int
  candidates: list[Candidate]

  @property
  def response(self) -> str:
    return self.candidates[self.best].response


def best_of_n(generator: Generator, requests: Sequence[steering.Request], n: int,
              scorer: AttributeScorer, weights: np.ndarray, max_new_tokens: int,
              sampling: SamplingConfig, seed: int = 0) -> list[BestOfN]:
  """Samples `n` responses per request (all in one batch), keeps the highest reward."""
  if n > 1 and sampling.greedy:
    raise ConfigError(f"best-of-{n} needs sampling: set sampling.temperature > 0 (greedy"
                      " decoding gives n identical responses)")
  prompts = [r.prompt_text() for r in requests for _ in range(n)]
  completions = generator.complete(prompts, max_new_tokens, sampling=sampling, seed=seed)
  responses = [steering.response_text(c.text, c.finish_reason) for c in completions]
  texts = [scoring_text(requests[i // n].conversation, r) for i, r in enumerate(responses)]

  def score(mine: Sequence[str]) -> np.ndarray:
    return checked_predictions(scorer(mine), len(mine), np.float64)

  if is_collective(scorer):  # on the mesh: every process passes every text
    scores = score(texts)
  else:  # host-side: each process scores its share of the candidates
    scores = multihost.split_map(score, texts, len(ATTRIBUTES), np.float64)
  rewards = scores @ weights
  out = []
  for start in range(0, len(texts), n):
    rows = range(start, start + n)
    candidates = [Candidate(responses[i], completions[i].finish_reason,
                            dict(zip(ATTRIBUTES, map(float, scores[i]))), float(rewards[i]))
                  for i in rows]
    out.append(BestOfN(int(np.argmax(rewards[start:start + n])), candidates))
  return out
