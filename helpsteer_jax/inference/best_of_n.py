"""Best-of-n: sample n responses, score them with an attribute model, keep the best.

A scorer maps texts in NeMo's regression reward-model format
(`template.regression_text`: the conversation with the response, ending in
the label marker where the attribute model reads its scores) to predictions
[n, 9] in `ATTRIBUTES` order. The reward is the weighted sum of the nine
predictions; the default weights are HelpSteer2's (helpfulness 0.65,
correctness 0.8, coherence 0.45, complexity 0.55, verbosity -0.4).

`config.best_of_n.scorer` names the scorer: `demo_rules` (the demo data's
own rules, `data.demo.rows.rule_scores`) or `package.module:factory`, a function
called with `config.best_of_n.scorer_path` that returns a scorer (how a
trained attribute model plugs in). With several processes, each scores its
contiguous share of the candidates and the scores are gathered.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from helpsteer_jax import multihost
from helpsteer_jax.data import template
from helpsteer_jax.data.demo import rows as demo_rows
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.generator import Generator
from helpsteer_jax.inference.sampling import SamplingConfig

HELPSTEER2_WEIGHTS = {"helpfulness": 0.65, "correctness": 0.8, "coherence": 0.45,
                      "complexity": 0.55, "verbosity": -0.4}


class Scorer(Protocol):
  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    """Attribute predictions [len(texts), 9] in `ATTRIBUTES` order."""


def weight_vector(weights: Mapping[str, float]) -> np.ndarray:
  """[9] reward weights from a name -> weight mapping (missing names weigh 0)."""
  unknown = sorted(set(weights) - set(ATTRIBUTES))
  if unknown:
    raise ConfigError(f"reward weights name unknown attribute(s) {unknown}; known:"
                      f" {', '.join(ATTRIBUTES)}")
  return np.asarray([float(weights.get(name, 0.0)) for name in ATTRIBUTES])


def scoring_text(conversation: Conversation, response: str) -> str:
  """The attribute model's input for `response` after `conversation`."""
  turns = conversation.turns + (Turn("Assistant", response),)
  return template.regression_text(dataclasses.replace(conversation, turns=turns))


def _last_exchange(text: str) -> tuple[str, str]:
  """(last user text, response) of a regression-format text."""
  body = text.removesuffix(template.LABEL_START).removesuffix(template.END_OF_TURN)
  head, _, response = body.rpartition(f"{template.TURN_START}Assistant{template.END_OF_NAME}")
  user = head.rpartition(f"{template.TURN_START}User{template.END_OF_NAME}")[2]
  return user.removesuffix(template.END_OF_TURN), response


class DemoRuleScorer:
  """Scores demo responses by the rules that generated the demo data
  (the four OASST attributes, which the demo data lacks, score 0)."""

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    rows = []
    for text in texts:
      scores = demo_rows.rule_scores(*_last_exchange(text))
      rows.append([scores.get(name, 0) for name in ATTRIBUTES])
    return np.asarray(rows, np.float32).reshape(len(texts), len(ATTRIBUTES))


SCORERS: dict[str, Callable[[str], Scorer]] = {"demo_rules": lambda path: DemoRuleScorer()}


def load_scorer(spec: str, path: str = "") -> Scorer:
  """A registered scorer name or a `module:factory` import path."""
  if spec in SCORERS:
    return SCORERS[spec](path)
  module_name, sep, attr = spec.partition(":")
  if not sep:
    raise ConfigError(f"best_of_n.scorer={spec!r}: use one of {sorted(SCORERS)} or"
                      " 'package.module:factory'")
  try:
    factory = getattr(importlib.import_module(module_name), attr)
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"best_of_n.scorer={spec!r} cannot be imported: {e}") from None
  return factory(path)


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
  """Samples `n` responses per request (all in one batch), keeps the highest reward."""
  if n > 1 and sampling.greedy:
    raise ConfigError(f"best-of-{n} needs sampling: set sampling.temperature > 0 (greedy"
                      " decoding gives n identical responses)")
  prompts = [r.prompt_text() for r in requests for _ in range(n)]
  completions = generator.complete(prompts, max_new_tokens, sampling=sampling, seed=seed)
  responses = [steering.response_text(c.text, c.finish_reason) for c in completions]
  texts = [scoring_text(requests[i // n].conversation, r) for i, r in enumerate(responses)]

  def score(mine: Sequence[str]) -> np.ndarray:
    out = np.asarray(scorer(mine), np.float64)
    if out.shape != (len(mine), len(ATTRIBUTES)):
      raise ValueError(f"the scorer returned shape {out.shape}; expected ({len(mine)},"
                       f" {len(ATTRIBUTES)}): one prediction per attribute of {ATTRIBUTES}")
    return out

  # Host-side: each process scores its share of the candidates.
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
