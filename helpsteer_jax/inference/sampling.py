"""Next-token selection: greedy, temperature, top-k and top-p (nucleus).

The filters follow transformers' `TopKLogitsWarper` and `TopPLogitsWarper`
(the reference the tests compare against): top-k keeps every token whose
logit is at least the k-th largest (ties at the boundary stay); top-p keeps
the smallest set of most likely tokens whose probability reaches p, i.e. a
token stays when the probability of the tokens ranked before it is < p
(the most likely token always stays). Filtered tokens get -inf.

`sample_seed` is the one rule for a sampled row's seed (RL rollouts, best-of-n,
the generating tasks' rows, the server's choices).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from helpsteer_jax.errors import ConfigError

MAX_LOGPROBS = 20  # the most likely alternatives reported per token (vLLM's default cap)


def sample_seed(base: int, *indices: int) -> int:
  """The uint32 sampling seed of one row: `base` (a run's or a request's seed) and the
  row's indices (e.g. step, prompt, sample) through a SeedSequence, the same on every
  process and call, distinct per index. Negative values wrap modulo 2**64 (SeedSequence
  takes non-negative entropy only)."""
  entropy = [int(x) % 2**64 for x in (base, *indices)]
  return int(np.random.SeedSequence(entropy).generate_state(1)[0])


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How to pick tokens. `temperature=0` is greedy (argmax); then top-k/p are unused.

  Hashable: a decode function is compiled per sampling configuration.
  """

  temperature: float = 0.0
  top_k: int = 0       # 0 = off
  top_p: float = 1.0   # 1.0 = off

  def __post_init__(self):
    problems = []
    if not self.temperature >= 0:
      problems.append(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
    if self.top_k < 0:
      problems.append(f"top_k={self.top_k} must be >= 0 (0 = off)")
    if not 0.0 < self.top_p <= 1.0:
      problems.append(f"top_p={self.top_p} must be in (0, 1] (1 = off)")
    if problems:
      raise ConfigError("invalid sampling settings: " + "; ".join(problems))

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0


def top_k_mask(logits: jax.Array, k: int) -> jax.Array:
  """True for the tokens top-k keeps: logit >= the k-th largest, per row."""
  k = min(k, logits.shape[-1])
  kth = jax.lax.top_k(logits, k)[0][..., -1:]
  return logits >= kth


def top_p_mask(logits: jax.Array, p: float) -> jax.Array:
  """True for the tokens nucleus sampling keeps (see the module docstring)."""
  order = jnp.argsort(-logits, axis=-1, stable=True)
  sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
  probs = jax.nn.softmax(sorted_logits.astype(jnp.float32), axis=-1)
  before = jnp.cumsum(probs, axis=-1) - probs
  keep_sorted = before < p
  keep_sorted = keep_sorted.at[..., 0].set(True)
  # Scatter the sorted decision back to vocabulary order.
  rows = jnp.arange(logits.shape[0])[:, None]
  return jnp.zeros(logits.shape, bool).at[rows, order].set(keep_sorted)


def filter_logits(logits: jax.Array, config: SamplingConfig) -> jax.Array:
  """Temperature-scaled fp32 logits [batch, vocab] with filtered tokens at -inf."""
  logits = logits.astype(jnp.float32) / config.temperature
  if config.top_k > 0:
    logits = jnp.where(top_k_mask(logits, config.top_k), logits, -jnp.inf)
  if config.top_p < 1.0:
    logits = jnp.where(top_p_mask(logits, config.top_p), logits, -jnp.inf)
  return logits


def next_token(logits: jax.Array, key: jax.Array, config: SamplingConfig) -> jax.Array:
  """Token ids [batch] from last-position logits [batch, vocab]."""
  if config.greedy:
    return argmax(logits)
  keys = jax.random.split(key, logits.shape[0])
  return categorical(keys, filter_logits(logits, config))


def argmax(logits: jax.Array) -> jax.Array:
  """`jnp.argmax` over the last axis (the first maximum) as a max and a masked min: one
  plain reduction each, where XLA:CPU's variadic arg-reduction is several times slower."""
  top = jnp.max(logits, axis=-1, keepdims=True)
  ids = jnp.arange(logits.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(logits == top, ids, logits.shape[-1]), axis=-1)


_BLOCK = 128  # vocabulary entries per block of the two-level inverse CDF


def categorical(keys: jax.Array, logits: jax.Array) -> jax.Array:
  """One draw per row from softmax(logits) ([batch, vocab], -inf = never), one key per row.

  Inverse-CDF sampling with one uniform per row, in two levels: the block of
  `_BLOCK` tokens from the cumulative block masses, then the token inside it.
  `jax.random.categorical` draws a Gumbel variate per vocabulary entry, which
  cost a decode step more than all its sampling arithmetic together.
  """
  b, v = logits.shape
  logits = jnp.pad(logits.astype(jnp.float32), ((0, 0), (0, -v % _BLOCK)),
                   constant_values=-jnp.inf)
  probs = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
  blocks = probs.reshape(b, -1, _BLOCK)
  mass = jnp.sum(blocks, axis=-1)
  cum = jnp.cumsum(mass, axis=-1)
  target = jax.vmap(jax.random.uniform)(keys) * cum[:, -1]

  def first_past(cumulative, weights, t):
    """The entry whose cumulative range holds t, kept among the entries of non-zero
    weight (rounding can put t just outside them)."""
    ids = jnp.arange(weights.shape[-1], dtype=jnp.int32)
    at = jnp.sum(cumulative <= t[:, None], axis=-1, dtype=jnp.int32)
    low = jnp.min(jnp.where(weights > 0, ids, weights.shape[-1]), axis=-1)
    high = jnp.max(jnp.where(weights > 0, ids, 0), axis=-1)
    return jnp.clip(at, low, high)

  block = first_past(cum, mass, target)
  inside = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]
  before = (jnp.take_along_axis(cum, block[:, None], axis=1)
            - jnp.take_along_axis(mass, block[:, None], axis=1))[:, 0]
  token = first_past(jnp.cumsum(inside, axis=-1), inside, target - before)
  return block * _BLOCK + token


def _log_softmax_at(logits: jax.Array, tokens: jax.Array) -> jax.Array:
  """log_softmax(logits)[row, tokens[row]] ([batch]) without forming [batch, vocab]."""
  top = jnp.max(logits, axis=-1)
  lse = jnp.log(jnp.sum(jnp.exp(logits - top[:, None]), axis=-1))
  return (jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0] - top) - lse


def top_k_rows_mask(logits: jax.Array, k: jax.Array) -> jax.Array:
  """`top_k_mask` with one k per row [batch] (0 = off): logit >= the row's k-th largest."""
  ranked = -jnp.sort(-logits, axis=-1)
  kth = jnp.take_along_axis(ranked, jnp.clip(k - 1, 0, logits.shape[-1] - 1)[:, None], axis=-1)
  return (logits >= kth) | (k <= 0)[:, None]


def sample_rows(logits: jax.Array, keys: jax.Array, temperature: jax.Array,
                top_p: jax.Array, top_k: jax.Array | None = None
                ) -> tuple[jax.Array, jax.Array]:
  """Token ids [batch] with per-row settings, and their log-probabilities [batch].

  temperature [batch] (0 = greedy), top_p [batch] (1 = off), top_k [batch]
  (0 = off) and one PRNG key per row. The settings are arrays, not static
  config, so rows that sample differently share one compiled function; the
  sorts run only when some row filters, sampling only when some row samples.
  A log-probability is under the distribution the row draws from: the
  model's for a greedy row; temperature-scaled, filtered and renormalised
  for a sampled one.
  """
  logits = logits.astype(jnp.float32)
  if top_k is None:
    top_k = jnp.zeros(logits.shape[:1], jnp.int32)
  greedy = argmax(logits)

  def sample() -> tuple[jax.Array, jax.Array]:
    scaled = logits / jnp.where(temperature > 0, temperature, 1.0)[:, None]
    scaled = jax.lax.cond(
        jnp.any(top_k > 0),
        lambda: jnp.where(top_k_rows_mask(scaled, top_k), scaled, -jnp.inf),
        lambda: scaled)
    scaled = jax.lax.cond(
        jnp.any(top_p < 1.0),
        lambda: jnp.where(top_p_mask(scaled, top_p[:, None]), scaled, -jnp.inf),
        lambda: scaled)
    tokens = jnp.where(temperature > 0, categorical(keys, scaled), greedy)
    logp = jnp.where(temperature > 0, _log_softmax_at(scaled, tokens),
                     _log_softmax_at(logits, greedy))
    return tokens, logp

  return jax.lax.cond(jnp.any(temperature > 0), sample,
                      lambda: (greedy, _log_softmax_at(logits, greedy)))


def raw_logprobs(logits: jax.Array, tokens: jax.Array, k: int = MAX_LOGPROBS
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The model's own log-probabilities (log_softmax of the logits, before temperature and
  filters, as vLLM's default `raw_logprobs`) of logits [batch, vocab]: of `tokens` [batch],
  and the `k` most likely ids and their log-probabilities [batch, k] each."""
  logits = logits.astype(jnp.float32)
  top = jnp.max(logits, axis=-1, keepdims=True)
  lse = jnp.log(jnp.sum(jnp.exp(logits - top), axis=-1, keepdims=True))
  best, ids = jax.lax.top_k(logits, min(k, logits.shape[-1]))
  chosen = jnp.take_along_axis(logits, tokens[:, None], axis=-1)
  return ((chosen - top) - lse)[:, 0], ids.astype(jnp.int32), (best - top) - lse
