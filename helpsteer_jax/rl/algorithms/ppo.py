"""PPO with a critic (TRL's PPOTrainer; NeMo-Aligner's PPO for HelpSteer2): per-token
rewards (minus `kl_coef` times the log-ratio to the reference at every token, the score
at the last), GAE on the critic's values, advantages whitened over the batch's tokens;
the critic (`rl.critic`) trains beside the policy on the clipped value loss."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from helpsteer_jax.data.batches import PPO_ROLLOUT_BATCH, BatchSchema
from helpsteer_jax.losses import advantages as adv_lib
from helpsteer_jax.rl.algorithms.base import Algorithm

CRITIC_INITS = ("policy", "scorer")


@dataclasses.dataclass(frozen=True)
class PPO(Algorithm):
  name: ClassVar[str] = "ppo"
  needs_critic: ClassVar[bool] = True
  default_aggregation: ClassVar[str] = "token"
  batch: ClassVar[BatchSchema] = PPO_ROLLOUT_BATCH

  kl_coef: float = 0.05      # the per-token KL in the reward
  gamma: float = 1.0
  lam: float = 0.95
  value_clip: float = 0.2
  value_coef: float = 0.1
  critic_init: str = "policy"  # the starting policy's backbone, or the attribute model's

  def problems(self) -> list[str]:
    out = []
    if self.kl_coef < 0:
      out.append(f"loss.kl_coef={self.kl_coef} must be >= 0")
    if self.critic_init not in CRITIC_INITS:
      out.append(f"loss.critic_init={self.critic_init!r}: choose 'policy' or 'scorer'")
    if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
      out.append(f"loss.gamma={self.gamma} and loss.lam={self.lam} must be in [0, 1]")
    return out

  @property
  def uses_reference(self) -> bool:
    return self.kl_coef > 0

  def advantages(self, rows: dict[str, np.ndarray], scores: np.ndarray, k: int,
                 logp: np.ndarray, ref_logp: np.ndarray, critic: Any = None) -> np.ndarray:
    """Whitened GAE advantages; adds the critic's `old_values` and the `returns` to `rows`."""
    mask = rows["mask"]
    values = critic.values(rows) * mask
    rewards_t = adv_lib.token_rewards(*(jnp.asarray(x, jnp.float32) for x in (
        scores, logp, ref_logp, mask)), self.kl_coef)
    adv, returns = adv_lib.gae(rewards_t, jnp.asarray(values), jnp.asarray(mask), self.gamma,
                               self.lam)
    rows.update(old_values=values, returns=np.asarray(returns, np.float32))
    return np.asarray(adv_lib.whiten(adv, jnp.asarray(mask)), np.float32)
