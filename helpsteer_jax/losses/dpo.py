"""Response-level preference losses as TRL's DPOTrainer defines them.

Inputs are per-pair log-ratios log pi(y|x) - log ref(y|x) summed over the
response tokens (chosen and rejected). With `h = chosen - rejected`:

- `sigmoid` (DPO, Rafailov et al. 2023; TRL `loss_type="sigmoid"` with
  `label_smoothing` e, the conservative DPO of Mitchell 2023):
  L = -(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h).
- `ipo` (Azar et al. 2023; TRL `loss_type="ipo"`): the log-probs are first
  averaged over each response's tokens, then L = (h - 1 / (2 beta))^2.

The implicit rewards reported are TRL's: beta * (log pi - log ref) of the
whole response (not length-normalised).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.named_scope("dpo_sigmoid_loss")
def dpo_sigmoid_loss(chosen_logratio: jax.Array, rejected_logratio: jax.Array, beta: float,
                     label_smoothing: float = 0.0) -> jax.Array:
  """Per-pair DPO loss (TRL sigmoid, optional label smoothing)."""
  h = chosen_logratio - rejected_logratio
  return (-(1.0 - label_smoothing) * jax.nn.log_sigmoid(beta * h)
          - label_smoothing * jax.nn.log_sigmoid(-beta * h))


@jax.named_scope("ipo_loss")
def ipo_loss(chosen_logratio: jax.Array, rejected_logratio: jax.Array,
             chosen_length: jax.Array, rejected_length: jax.Array, beta: float) -> jax.Array:
  """Per-pair IPO loss on length-normalised log-ratios (TRL ipo)."""
  h = (chosen_logratio / jnp.maximum(chosen_length, 1.0)
       - rejected_logratio / jnp.maximum(rejected_length, 1.0))
  return (h - 1.0 / (2.0 * beta)) ** 2
