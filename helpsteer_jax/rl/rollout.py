"""Rollouts: K sampled completions per prompt from the engine's batch API, as arrays.

The policy's current weights are in the engine (`Engine.load_weights` after
each update); sampling runs on the same devices as training, through
`inference.sample_score` (the path best-of-n shares). Every completion's seed
is `sample_seed(seed, step, prompt, sample)`, so every process of a
multi-process run draws the same completions and a resumed step draws them
again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from helpsteer_jax.inference import sample_score, steering
from helpsteer_jax.inference.engine import Engine, Output
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.scoring.scorer import Scorer


@dataclasses.dataclass
class Prompt:
  """A prompt to answer and its token ids (the AC-SFT prompt format, with its label)."""

  request: steering.Request
  ids: list[int]


def prompt_schedule(n: int, per_iteration: int, seed: int, iteration: int) -> list[int]:
  """Which of `n` prompts iteration `iteration` answers: `per_iteration` of them, taken
  in order from epochs over the prompts, each epoch in its own (seed, epoch) order."""
  orders: dict[int, np.ndarray] = {}
  out = []
  for pos in range(iteration * per_iteration, (iteration + 1) * per_iteration):
    epoch, i = divmod(pos, n)
    if epoch not in orders:
      orders[epoch] = np.random.default_rng([seed, epoch]).permutation(n)
    out.append(int(orders[epoch][i]))
  return out


@dataclasses.dataclass
class Rollouts:
  """P prompts x K completions, prompt-major (completion b is prompt b // K's sample
  b % K), padded to `max_new_tokens` T.

  tokens [B, T] int32 (`pad_id` after each completion), mask [B, T] float32
  (1 through the stop token, or the last token when the limit ended it),
  sampler_logp [B, T] float32 (each token's log-probability under the
  distribution it was drawn from; 0 on padding), finished [B] bool (a stop
  ended it, not the limit), texts [B] (stop strings cut). Multi-turn rollouts
  (`rl.multiturn`) hold every turn after the first prompt, `mask` 1 on the
  policy's tokens only, and `answers` [B] lists each completion's answers.
  """

  prompts: list[list[int]]
  k: int
  tokens: np.ndarray
  mask: np.ndarray
  sampler_logp: np.ndarray
  finished: np.ndarray
  texts: list[str]
  answers: list[list[str]] | None = None


def longest_answer(mask: np.ndarray) -> np.ndarray:
  """[B] tokens of each row's longest answer: its longest run of masked tokens (the whole
  completion, single-turn)."""
  out = np.zeros(mask.shape[0], np.int64)
  for b, row in enumerate(mask > 0):
    edges = np.diff(np.concatenate([[0], row.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    out[b] = (ends - starts).max() if len(starts) else 0
  return out


def arrays(prompts: Sequence[Sequence[int]], k: int, outputs: Sequence[Output],
           max_new_tokens: int, pad_id: int = 0) -> Rollouts:
  """The engine's outputs [P * K] (prompt-major) as padded `Rollouts`."""
  b = len(outputs)
  tokens = np.full((b, max_new_tokens), pad_id, np.int32)
  mask = np.zeros((b, max_new_tokens), np.float32)
  logp = np.zeros((b, max_new_tokens), np.float32)
  for i, out in enumerate(outputs):
    n = len(out.token_ids)
    tokens[i, :n], mask[i, :n], logp[i, :n] = out.token_ids, 1.0, out.logprobs[:n]
  return Rollouts([list(p) for p in prompts], k, tokens, mask, logp,
                  np.asarray([o.finish_reason == "stop" for o in outputs]),
                  [o.text for o in outputs])


def _keys(n: int, seed: int, step: int, first: int = 0) -> list[tuple[int, ...]]:
  """The seed keys of `n` prompts at positions `first`.. of iteration `step`."""
  return [(seed, step, first + i) for i in range(n)]


def sample(engine: Engine, prompts: Sequence[Sequence[int]], k: int, max_new_tokens: int, *,
           temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
           step: int = 0, pad_id: int = 0) -> Rollouts:
  """K completions of each prompt (token ids) with the engine's current weights."""
  sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
  outputs = sample_score.sample(engine, prompts, k, max_new_tokens, sampling,
                                _keys(len(prompts), seed, step))
  return arrays(prompts, k, outputs, max_new_tokens, pad_id)


def score(r: Rollouts, prompts: Sequence[Prompt], scorer: Scorer) -> np.ndarray:
  """The scorer's [P * K, 9] predictions of rollouts `r` of `prompts` (drawn apart from
  their scoring: `rl.off_policy`), as `sample_and_score` scores them."""
  responses = [steering.response_text(t, "stop" if f else "length")
               for t, f in zip(r.texts, r.finished)]
  return sample_score.score(responses, [p.request for p in prompts], r.k, scorer)


def sample_and_score(engine: Engine, prompts: Sequence[Prompt], k: int, max_new_tokens: int,
                     scorer: Scorer, *, temperature: float = 1.0, top_p: float = 1.0,
                     top_k: int = 0, seed: int = 0, step: int = 0, pad_id: int = 0,
                     on_sampled: Callable[[Rollouts], Any] | None = None, first: int = 0
                     ) -> tuple[Rollouts, np.ndarray, Any]:
  """`sample`'s rollouts of `prompts`, the scorer's [P * K, 9] predictions of them, and
  what `on_sampled(rollouts)` returned (it runs before scoring; None without one).
  `first`: the prompts' first position in the iteration (their seeds' index)."""
  ids = [p.ids for p in prompts]
  done: list = [None, None]

  def sampled(outputs: list[Output]) -> None:
    done[0] = arrays(ids, k, outputs, max_new_tokens, pad_id)
    done[1] = None if on_sampled is None else on_sampled(done[0])

  sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
  scored = sample_score.sample_and_score(engine, ids, [p.request for p in prompts], k,
                                         max_new_tokens, sampling,
                                         _keys(len(ids), seed, step, first),
                                         scorer, on_sampled=sampled)
  return done[0], scored.predictions, done[1]
