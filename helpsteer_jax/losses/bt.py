"""Bradley-Terry losses on preference pairs (HelpSteer2-Preference).

With r_c, r_r the rewards of the chosen and rejected response and m the
preference strength (|preference_strength|, 1..3):
  regular_bt: -log sigmoid(r_c - r_r)
  margin_bt:  -log sigmoid(r_c - r_r - m)
  scaled_bt:  m * -log sigmoid(r_c - r_r)
(Wang et al. 2024, "HelpSteer2-Preference", eqs. 1-3). The reward is one
slot of the reward model's head (helpfulness by default).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from helpsteer_jax import choices
from helpsteer_jax.data.batches import BT_BATCH
from helpsteer_jax.data.records import ATTRIBUTES, CHOSEN, REJECTED

BT_VARIANTS = choices.BT_VARIANTS


def bt_pair_losses(r_chosen: jax.Array, r_rejected: jax.Array, margin: jax.Array,
                   variant: str) -> jax.Array:
  """Per-pair loss of one variant (all inputs [N], fp32)."""
  diff = r_chosen.astype(jnp.float32) - r_rejected.astype(jnp.float32)
  margin = jnp.abs(margin.astype(jnp.float32))
  if variant == "regular_bt":
    return -jax.nn.log_sigmoid(diff)
  if variant == "margin_bt":
    return -jax.nn.log_sigmoid(diff - margin)
  if variant == "scaled_bt":
    return margin * -jax.nn.log_sigmoid(diff)
  raise ValueError(f"unknown Bradley-Terry variant {variant!r}; choose one of {BT_VARIANTS}")


def pair_rewards(rewards: jax.Array, pair: jax.Array, margin: jax.Array):
  """(r_c, r_r, m, has_pair) per row from per-token rewards [B, T].

  Each row holds one pair: `pair` is CHOSEN / REJECTED at the last token of
  each response and `margin` carries the strength at the chosen one.
  """
  is_c, is_r = pair == CHOSEN, pair == REJECTED
  r_c = jnp.sum(jnp.where(is_c, rewards, 0.0), axis=1)
  r_r = jnp.sum(jnp.where(is_r, rewards, 0.0), axis=1)
  m = jnp.sum(jnp.where(is_c, margin, 0.0), axis=1)
  has_pair = (jnp.any(is_c, axis=1) & jnp.any(is_r, axis=1)).astype(jnp.float32)
  return r_c, r_r, m, has_pair


def bt_loss(model: nnx.Module, batch: dict[str, jax.Array], variant: str = "regular_bt",
            attribute: str = "helpfulness"):
  """Summed pair losses of a micro-batch; `weight` = number of pairs."""
  slot = ATTRIBUTES.index(attribute)
  b = BT_BATCH.view(batch)
  rewards = model(b.inputs, b.positions, b.segment_ids)[..., slot]
  with jax.named_scope("bt_loss"):
    r_c, r_r, m, has_pair = pair_rewards(rewards, b.pair, b.margin)
    losses = bt_pair_losses(r_c, r_r, m, variant) * has_pair
    correct = jnp.sum(has_pair * (r_c > r_r))
    return jnp.sum(losses), {"weight": jnp.sum(has_pair), "accuracy": correct,
                             "reward_gap": jnp.sum(has_pair * (r_c - r_r))}
