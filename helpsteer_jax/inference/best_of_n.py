"""Best-of-n: sample n responses, score them with the attribute model, keep the best.

The scorer is a `scoring.scorer.Scorer` (conversations -> [n, 9], the same on
every process: `scoring.load.load_scorer` shares the work out); the reward is
the weighted sum of the nine predictions (`scoring.rewards`; by default
HelpSteer2's weights: helpfulness 0.65, correctness 0.8, coherence 0.45,
complexity 0.55, verbosity -0.4).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import sample_score, steering
from helpsteer_jax.inference.generator import Generator
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.scoring import rewards as rewards_lib
from helpsteer_jax.scoring.scorer import Scorer


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
              scorer: Scorer, weights: np.ndarray, max_new_tokens: int,
              sampling: SamplingConfig, seed: int = 0) -> list[BestOfN]:
  """Samples `n` responses per request (all in one batch), keeps the highest reward.

  Request i's k-th sample uses `sample_seed(seed + i, k)` (`inference.sample_score`,
  the path RL's rollouts share): a sample depends on its request's place in the input
  (a batch passes the run's seed + its first request), not on the batches.
  """
  if n > 1 and sampling.greedy:
    raise ConfigError(f"best-of-{n} needs sampling: set sampling.temperature > 0 (greedy"
                      " decoding gives n identical responses)")
  prompts = [generator.prompt_ids(r.prompt_text(), i, max_new_tokens)
             for i, r in enumerate(requests)]
  scored = sample_score.sample_and_score(generator.engine, prompts, requests, n,
                                         max_new_tokens, sampling,
                                         [(seed + i,) for i in range(len(requests))], scorer)
  scores = scored.predictions.astype(np.float64)
  rewards = rewards_lib.rewards(scores, weights)
  out = []
  for start in range(0, len(scores), n):
    candidates = [Candidate(scored.responses[i], scored.outputs[i].finish_reason,
                            dict(zip(ATTRIBUTES, map(float, scores[i]))), float(rewards[i]))
                  for i in range(start, start + n)]
    ranked = np.nan_to_num(rewards[start:start + n], nan=-np.inf)  # unscored ranks last
    out.append(BestOfN(int(np.argmax(ranked)), candidates))
  return out
