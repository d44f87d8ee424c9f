"""2D-DPO (Li et al., NAACL Findings 2025): segment x aspect weighted DPO.

Each response is split into segments; segment k has aspect scores s_k
(normalised to [0, 1]) and weight r_k = W . s_k. Its log-ratio is
lr_k = sum over its tokens of log pi - log ref (no length normalisation).

- Eq. 5 (ungrouped): L = -log sigmoid(beta sum_k r_wk lr_wk - beta sum_k r_lk lr_lk).
- Eq. 6 (grouped, the paper's final loss): N = min(S_w, S_l); the N chosen
  segments with the highest r (descending) meet the N rejected segments with
  the lowest r (ascending), ties in segment order;
  L = -sum_{i<N} log sigmoid(beta r_w(i) lr_w(i) - beta r_l(i) lr_l(i)).

Segments are padded to a fixed count S with a validity mask, so the
selection is two stable argsorts and a gather: no Python loop, jit-friendly.

Baselines through the same inputs: `dpo` and `ipo` (losses.dpo, TRL's
formulas on the whole response), `dpo1d_segment` (r_k = the mean of the
aspect scores instead of W . s_k), `dpo1d_aspect` (one segment per response,
r = W . the response's mean segment scores).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from helpsteer_jax import choices
from helpsteer_jax.losses import dpo

LOSS_TYPES = choices.PREFERENCE_LOSSES
SEQUENCE_LOSSES = choices.SEQUENCE_LOSSES  # read whole responses' log-ratios, no segment scores


class PairInputs(NamedTuple):
  """Per-pair arrays; axis 1 is (chosen, rejected).

  policy, reference: [B, 2, S] per-segment log-prob sums. scores:
  [B, 2, S, A] aspect scores in [0, 1]. mask: [B, 2, S] valid segments.
  lengths: [B, 2] response tokens. pair_weight: [B] (0 for padding rows).
  """
  policy: jax.Array
  reference: jax.Array
  scores: jax.Array
  mask: jax.Array
  lengths: jax.Array
  pair_weight: jax.Array


@dataclasses.dataclass(frozen=True)
class PreferenceLossConfig:
  loss_type: str = "dpo2d"
  beta: float = 0.1
  grouped: bool = True            # Eq. 6 (True) or Eq. 5 (False) for dpo2d / dpo1d_segment
  label_smoothing: float = 0.0    # dpo only
  aspect_weights: tuple[float, ...] = (0.2, 0.2, 0.2, 0.2, 0.2)
  aspects: tuple[str, ...] = ("helpfulness", "correctness", "safety", "completeness", "clarity")


def segment_weights(scores: jax.Array, aspect_weights: jax.Array) -> jax.Array:
  """r = W . s over the last axis."""
  return jnp.einsum("...a,a->...", scores, aspect_weights)


def ungrouped_margin(lr_w, r_w, lr_l, r_l, beta: float) -> jax.Array:
  """beta * (sum_k r_wk lr_wk - sum_k r_lk lr_lk) per pair (masked entries are 0)."""
  return beta * (jnp.sum(r_w * lr_w, -1) - jnp.sum(r_l * lr_l, -1))


def grouped_order(r: jax.Array, mask: jax.Array, descending: bool) -> jax.Array:
  """Segment indices by r (descending or ascending), padding last, stable on ties."""
  key = -r if descending else r
  key = jnp.where(mask, key, jnp.inf) + 0.0  # + 0.0 folds -0.0 into 0.0 (one tie class)
  return jnp.argsort(key, axis=-1, stable=True)


def grouped_terms(lr_w, r_w, mask_w, lr_l, r_l, mask_l, beta: float):
  """(beta r_w(i) lr_w(i) - beta r_l(i) lr_l(i), valid i < N) of Eq. 6, each [B, S]."""
  ow = grouped_order(r_w, mask_w, descending=True)
  ol = grouped_order(r_l, mask_l, descending=False)
  take = lambda x, o: jnp.take_along_axis(x, o, axis=-1)
  terms = beta * (take(r_w, ow) * take(lr_w, ow) - take(r_l, ol) * take(lr_l, ol))
  n = jnp.minimum(jnp.sum(mask_w, -1), jnp.sum(mask_l, -1))
  valid = jnp.arange(r_w.shape[-1]) < n[..., None]
  return terms, valid


@jax.named_scope("dpo2d_pair_losses")
def pair_losses(x: PairInputs, cfg: PreferenceLossConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-pair loss [B] and per-pair metrics (sum them; divide by the pair count)."""
  if cfg.loss_type not in LOSS_TYPES:
    raise ValueError(f"loss_type={cfg.loss_type!r}; choose one of {LOSS_TYPES}")
  beta = cfg.beta
  mask = x.mask.astype(jnp.float32)
  lr = (x.policy - x.reference) * mask                       # [B, 2, S]
  aw = jnp.asarray(cfg.aspect_weights, jnp.float32)
  scores = x.scores * mask[..., None]
  r = segment_weights(scores, aw)                             # [B, 2, S]
  resp_lr = jnp.sum(lr, -1)                                   # [B, 2]
  ungrouped = ungrouped_margin(lr[:, 0], r[:, 0], lr[:, 1], r[:, 1], beta)
  terms, valid = grouped_terms(lr[:, 0], r[:, 0], x.mask[:, 0], lr[:, 1], r[:, 1],
                               x.mask[:, 1], beta)

  if cfg.loss_type == "dpo":
    loss = dpo.dpo_sigmoid_loss(resp_lr[:, 0], resp_lr[:, 1], beta, cfg.label_smoothing)
  elif cfg.loss_type == "ipo":
    loss = dpo.ipo_loss(resp_lr[:, 0], resp_lr[:, 1], x.lengths[:, 0], x.lengths[:, 1], beta)
  elif cfg.loss_type == "dpo1d_aspect":
    n_seg = jnp.maximum(jnp.sum(mask, -1), 1.0)              # [B, 2]
    r_resp = segment_weights(jnp.sum(scores, 2) / n_seg[..., None], aw)
    loss = -jax.nn.log_sigmoid(beta * (r_resp[:, 0] * resp_lr[:, 0] - r_resp[:, 1] * resp_lr[:, 1]))
  else:
    if cfg.loss_type == "dpo1d_segment":
      r1 = jnp.mean(scores, -1)
      margin = ungrouped_margin(lr[:, 0], r1[:, 0], lr[:, 1], r1[:, 1], beta)
      terms_1d, valid_1d = grouped_terms(lr[:, 0], r1[:, 0], x.mask[:, 0], lr[:, 1], r1[:, 1],
                                         x.mask[:, 1], beta)
    else:
      margin, terms_1d, valid_1d = ungrouped, terms, valid
    if cfg.grouped:
      loss = -jnp.sum(jnp.where(valid_1d, jax.nn.log_sigmoid(terms_1d), 0.0), -1)
    else:
      loss = -jax.nn.log_sigmoid(margin)

  w = x.pair_weight.astype(jnp.float32)
  rewards = beta * resp_lr                                    # TRL implicit rewards
  n_valid = jnp.sum(valid, -1)
  metrics = {
      "reward_chosen": rewards[:, 0], "reward_rejected": rewards[:, 1],
      "reward_margin": rewards[:, 0] - rewards[:, 1],
      "reward_accuracy": (rewards[:, 0] > rewards[:, 1]).astype(jnp.float32),
      "margin_2d": ungrouped,
      "accuracy_2d_ungrouped": (ungrouped > 0).astype(jnp.float32),
      "accuracy_2d_grouped": jnp.sum(valid & (terms > 0), -1) / jnp.maximum(n_valid, 1),
  }
  per_aspect = beta * jnp.einsum("bsa,a,bs->ba", scores[:, 0], aw, lr[:, 0]) \
      - beta * jnp.einsum("bsa,a,bs->ba", scores[:, 1], aw, lr[:, 1])
  for i, name in enumerate(cfg.aspects):
    metrics[f"margin_{name}"] = per_aspect[:, i]
  return loss * w, {k: v * w for k, v in metrics.items()}
