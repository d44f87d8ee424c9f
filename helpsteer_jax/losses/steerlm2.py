"""SteerLM 2.0 (HelpSteer2, arXiv 2406.08673, section 5; NeMo-Aligner's GPTSteerLMModel).

For a prompt x, requested attributes a and n responses y_i drawn from the
starting SteerLM model Q'(y|a,x), the target P(y|a,x) ∝ P(a|x,y) P(y|x) is
reached through self-normalised importance weights and a baseline:

  w = softmax_i(log P(a|x,y_i) + log P(y_i|x) - log Q'(y_i|a,x))   (host, float64:
                                          `data.features.steerlm2_rows.importance_weights`)
  b = softmax_i(log Q_θ(y_i|a,x) - log Q'(y_i|a,x))          (no gradient)
  L = Σ_i (w_i - b_i) · NLL_θ(y_i) / mean_i(response tokens)

averaged over groups; its gradient is -Σ (w - b) ∇ log Q_θ. The logged
distance is Σ w log(w / b) with 1e-8 added to both. log P(a|x,y) comes from
the attribute model's regression predictions: each requested value's
probability under a normal density centred at the prediction, normalised
over the label values 0..4 (`attribute_logprob`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from helpsteer_jax.data.batches import STEERLM2_BATCH, STEERLM2_INPUT
from helpsteer_jax.data.records import MAX_SCORE, MIN_SCORE
from helpsteer_jax.losses.logprobs import token_logprobs

DISTANCE_EPS = 1e-8  # NeMo-Aligner's smoothing of both weight vectors in the distance


def attribute_logprob(predictions: np.ndarray, requested: np.ndarray, mask: np.ndarray,
                      sigma: float) -> np.ndarray:
  """log P(a|x,y) [N] from regression predictions [N, A], requested values [N, A] and a
  mask [N, A] of the attributes asked for: the requested value's log-probability under
  N(prediction, sigma²) restricted to the integer labels, summed over the masked
  attributes (independent given the response)."""
  values = np.arange(MIN_SCORE, MAX_SCORE + 1, dtype=np.float64)
  logits = -(values - np.asarray(predictions, np.float64)[..., None]) ** 2 / (2 * sigma ** 2)
  logits -= logits.max(-1, keepdims=True)
  log_norm = np.log(np.exp(logits).sum(-1))
  chosen = np.take_along_axis(
      logits, (np.asarray(requested, np.int64) - MIN_SCORE)[..., None], -1)[..., 0]
  return ((chosen - log_norm) * np.asarray(mask, np.float64)).sum(-1)


@jax.named_scope("steerlm2_loss")
def group_loss(nll: jax.Array, log_q_start: jax.Array, ws: jax.Array, tokens: jax.Array,
               group_weight: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(summed loss, summed metrics with `weight` = groups) of groups of n responses.

  nll [G, n]: NLL_θ summed over each response's tokens; log_q_start [G, n]; ws [G, n]
  the importance weights; tokens [G, n] response tokens; group_weight [G] 1 for a real
  group, 0 for padding.
  """
  base = jax.nn.softmax(-jax.lax.stop_gradient(nll) - log_q_start, axis=-1)
  mean_tokens = jnp.maximum(tokens.mean(-1), 1.0)
  per_group = ((ws - base) * nll).sum(-1) / mean_tokens
  w, bw = ws + DISTANCE_EPS, base + DISTANCE_EPS
  distance = (w * jnp.log(w / bw)).sum(-1)
  nll_per_token = nll.sum(-1) / jnp.maximum(tokens.sum(-1), 1.0)
  mask = group_weight
  return (per_group * mask).sum(), {
      "distance": (distance * mask).sum(),
      "nll_per_token": (nll_per_token * mask).sum(),
      "base_weight_max": (base.max(-1) * mask).sum(),
      "importance_weight_max": (ws.max(-1) * mask).sum(),
      "weight": mask.sum()}


def _fold(x: jax.Array) -> jax.Array:
  return x.reshape((-1,) + x.shape[2:])


def response_nll(model: nnx.Module, batch: dict[str, jax.Array],
                 chunk_size: int = 256) -> jax.Array:
  """NLL [G, n] of each response's loss tokens under `model`, one forward over all G·n
  rows (the fused projection: no [rows, length, vocab] logits)."""
  b = STEERLM2_INPUT.view(batch)
  g, n = b.inputs.shape[:2]
  hidden = model(_fold(b.inputs), _fold(b.positions), _fold(b.segment_ids))
  lp = token_logprobs(hidden, model.head_weight(), _fold(b.targets), chunk_size,
                      model.cfg.final_logit_softcap)
  return -(lp * _fold(b.weights)).sum(-1).reshape(g, n)


def steerlm2_loss(model: nnx.Module, batch: dict[str, jax.Array], *,
                  chunk_size: int = 256) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The training loop's loss on a `STEERLM2_BATCH` of groups."""
  b = STEERLM2_BATCH.view(batch)
  return group_loss(response_nll(model, batch, chunk_size), b.log_q, b.ws,
                    b.weights.sum(-1), b.group_weight[:, 0])
