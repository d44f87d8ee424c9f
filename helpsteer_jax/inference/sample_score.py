"""n sampled completions per prompt, scored: the one path of RL rollouts and best-of-n.

Prompts are token ids; completion j of prompt i samples with
`sample_seed(*keys[i], j)` (`inference.sampling`'s rule), so it depends on its
prompt's key alone, not on the batch: RL's key is (seed, step, i), best-of-n's
(seed + i,). The engine's batch API decodes every completion in one call;
the scorer (`scoring.scorer.Scorer`) then predicts the nine attributes of each
answered conversation, the same on every process. `judged` says, before anything
compiles, which requests a generative judge behind the scorer has room to judge.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from helpsteer_jax.inference import steering
from helpsteer_jax.inference.engine import DecodeRequest, Engine, Output
from helpsteer_jax.inference.sampling import SamplingConfig, sample_seed
from helpsteer_jax.scoring import judge_budget
from helpsteer_jax.scoring.scorer import Scorer, predict


@dataclasses.dataclass
class Scored:
  """P prompts x n completions, prompt-major (completion b is prompt b // n's sample
  b % n): the engine's outputs [B], the responses (the text without the turn's end
  marker) [B] and the scorer's predictions [B, 9] float32 (NaN rows: not scored)."""

  outputs: list[Output]
  responses: list[str]
  predictions: np.ndarray


def sample(engine: Engine, prompts: Sequence[Sequence[int]], n: int, max_new_tokens: int,
           sampling: SamplingConfig, keys: Sequence[Sequence[int]]) -> list[Output]:
  """`n` completions of each prompt, prompt-major; prompt i's seeds from `keys[i]`."""
  if len(keys) != len(prompts):
    raise ValueError(f"{len(keys)} seed keys for {len(prompts)} prompts")
  requests = [DecodeRequest(list(p), max_new_tokens, temperature=sampling.temperature,
                            top_p=sampling.top_p, top_k=sampling.top_k,
                            seed=sample_seed(*key, j))
              for p, key in zip(prompts, keys) for j in range(n)]
  return engine.generate(requests)


def sample_and_score(engine: Engine, prompts: Sequence[Sequence[int]],
                     requests: Sequence[steering.Request], n: int, max_new_tokens: int,
                     sampling: SamplingConfig, keys: Sequence[Sequence[int]], scorer: Scorer,
                     on_sampled: Callable[[list[Output]], Any] | None = None) -> Scored:
  """`sample`, then each response scored as the answer to its prompt's request.

  `on_sampled(outputs)` runs between the two (RL dispatches its device passes there, so
  the devices compute while the host prepares the scorer's batches).
  """
  outputs = sample(engine, prompts, n, max_new_tokens, sampling, keys)
  if on_sampled is not None:
    on_sampled(outputs)
  responses = [steering.response_text(o.text, o.finish_reason) for o in outputs]
  return Scored(outputs, responses, score(responses, requests, n, scorer, outputs))


def score(responses: Sequence[str], requests: Sequence[steering.Request], n: int,
          scorer: Scorer, outputs: Sequence[Output] | None = None) -> np.ndarray:
  """[P * n, 9] predictions of `responses` (prompt-major), each the answer to its prompt's
  request; a request with a reference carries the engine's output (`outputs` [P * n])
  that wrote its response."""
  return predict([requests[b // n].answered(r, None if outputs is None else outputs[b])
                  for b, r in enumerate(responses)], scorer)


def judged(scorer: Scorer, requests: Sequence[steering.Request], what: str) -> np.ndarray:
  """[len(requests)] whether the local generative judge behind `scorer` has room in its
  budget to judge answers to each request (its judge prompt with empty answers fits:
  `scoring.judge_budget.fitting`; all True for any other scorer); ConfigError when none
  has."""
  return judge_budget.fitting(scorer, [[r.answered("")] * 2 for r in requests], what)
