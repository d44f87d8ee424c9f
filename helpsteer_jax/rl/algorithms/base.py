"""What an online RL algorithm declares and computes; `rl.trainer` asks, never names one.

An algorithm is a frozen dataclass of its own settings (read from `config.loss` by
field name, each checked by `problems`) whose class declares what an iteration
must provide:

- `min_samples`: completions per prompt it needs (a group baseline needs 2);
- `needs_critic`: a value model trained beside the policy (`rl.critic`);
- `needs_teacher`: a frozen teacher whose forward runs in the loss (`rl.teacher`);
- `needs_old_logprobs`: the sampling policy's log-probs recomputed on the
  training path even with one optimizer step per rollout batch;
- `default_aggregation`: how its per-token losses become the batch loss (unless
  `loss.aggregation` names one; `required_aggregation`, where a setting fixes it);
- `default_clip`: (eps_low, eps_high) of the clipped ratio unless `loss.eps_low` /
  `loss.eps_high` are set;
- `batch`: the schema of the rows an iteration trains on: `ROLLOUT_BATCH`, which the
  policy's loss reads, or an extension with the fields its other models read (PPO's
  critic).

Every algorithm also has DAPO's rollout-side settings (Yu et al. 2025; off unless
set, on by default in `dapo`): the overlong reward shaping (`overlong_buffer`,
`overlong_penalty`: `length_scores`), the filtering of truncated completions out of
the loss (`filter_truncated`) and dynamic sampling (`dynamic_sampling_rounds`: the
loop's `rl.dynamic_sampling`).

Per iteration it turns the rollouts' scores [R] into per-token advantages [R, T]
(`shape_scores`, then `advantages`) and a micro-batch's log-probs into the
summed loss (`loss_sums`), from `losses.advantages` and `losses.policy_gradient`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import ml_collections
import numpy as np

from helpsteer_jax.data.batches import ROLLOUT_BATCH, BatchSchema
from helpsteer_jax.losses import advantages as adv_lib
from helpsteer_jax.losses import policy_gradient


@dataclasses.dataclass(frozen=True)
class LossSettings:
  """The clipped objective's settings every algorithm shares (`RLSettings` holds them);
  `sampler_correction`: the batch's `sampler_weight` multiplies the surrogate."""
  eps_low: float
  eps_high: float
  aggregation: str
  max_tokens: int
  sampler_correction: bool = False

  def sampler_weights(self, batch: Any) -> jax.Array | None:
    return batch.sampler_weight if self.sampler_correction else None


@dataclasses.dataclass(frozen=True)
class Algorithm:
  name: ClassVar[str]
  min_samples: ClassVar[int] = 1
  needs_critic: ClassVar[bool] = False
  needs_teacher: ClassVar[bool] = False
  token_metrics: ClassVar[tuple[str, ...]] = ()  # loss sums reported per token
  needs_old_logprobs: ClassVar[bool] = False
  default_aggregation: ClassVar[str] = "token"
  default_clip: ClassVar[tuple[float, float]] = (0.2, 0.2)
  batch: ClassVar[BatchSchema] = ROLLOUT_BATCH

  overlong_buffer: int = 0          # DAPO's L_cache: the penalty's tokens before the limit
  overlong_penalty: float = 1.0     # the penalty at the limit
  filter_truncated: bool = False    # completions cut at the limit out of the loss
  dynamic_sampling_rounds: int = 0  # extra rollout rounds replacing equal-reward groups

  @classmethod
  def from_config(cls, loss: ml_collections.ConfigDict) -> Algorithm:
    """The algorithm with its fields read from `config.loss` (missing or None: defaults)."""
    values = {}
    for f in dataclasses.fields(cls):
      if loss.get(f.name) is not None:
        kind = type(f.default) if f.default is not dataclasses.MISSING else float
        values[f.name] = kind(loss[f.name])
    return cls(**values)

  def problems(self) -> list[str]:
    """What is wrong with the settings, each naming the key to change."""
    return []

  def resolved(self, max_new_tokens: int) -> Algorithm:
    """The settings with those that depend on the rollout length filled in."""
    return self

  def rollout_problems(self, max_new_tokens: int, k: int) -> list[str]:
    """What is wrong with the rollout-side settings every algorithm has."""
    out = []
    if not 0 <= self.overlong_buffer < max_new_tokens:
      out.append(f"loss.overlong_buffer={self.overlong_buffer} must be in 0.."
                 f"{max_new_tokens - 1} (the last tokens before rollout.max_new_tokens)")
    if self.overlong_penalty < 0:
      out.append(f"loss.overlong_penalty={self.overlong_penalty} must be >= 0")
    if self.dynamic_sampling_rounds < 0:
      out.append(f"loss.dynamic_sampling_rounds={self.dynamic_sampling_rounds} must be >= 0")
    if self.dynamic_sampling_rounds and k < 2:
      out.append("loss.dynamic_sampling_rounds drops groups whose rewards are all equal:"
                 f" it needs rollout.samples_per_prompt >= 2, not {k}")
    return out

  def length_scores(self, scores: np.ndarray, lengths: np.ndarray,
                    max_new_tokens: int) -> np.ndarray:
    """[R] scores with DAPO's overlong reward shaping added (`overlong_buffer` > 0);
    `lengths` [R] the completions' token counts."""
    if not self.overlong_buffer:
      return scores
    return scores + adv_lib.overlong_penalty(lengths, max_new_tokens, self.overlong_buffer,
                                             self.overlong_penalty)

  @property
  def uses_reference(self) -> bool:
    """Whether an iteration computes the reference's log-probabilities."""
    return False

  @property
  def importance_level(self) -> str:
    """Where the ratio to the sampling policy is taken and clipped (one of
    `policy_gradient.IMPORTANCE_LEVELS`)."""
    return "token"

  @property
  def required_aggregation(self) -> str | None:
    """The aggregation these settings' loss is defined with, if they fix one."""
    return None

  def shape_scores(self, scores: np.ndarray, logp: np.ndarray, ref_logp: np.ndarray,
                   mask: np.ndarray) -> np.ndarray:
    """[R] completion scores as the advantages read them (e.g. a KL penalty folded in);
    `logp`, `ref_logp`, `mask` [R, T] (the reference's zeros without one)."""
    return scores

  def advantages(self, rows: dict[str, np.ndarray], scores: np.ndarray, k: int,
                 logp: np.ndarray, ref_logp: np.ndarray, critic: Any = None) -> np.ndarray:
    """[R, T] per-token advantages (0 past the mask) of the R = P * K rollouts (the K
    samples of a prompt adjacent); may add the batch's other fields to `rows`."""
    raise NotImplementedError

  def loss_sums(self, logp: jax.Array, old_logp: jax.Array, batch: Any,
                common: LossSettings) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """(summed loss, its normaliser, token sums) of a micro-batch; `batch` is a view of
    `ROLLOUT_BATCH`. The clipped surrogate without a KL term by default."""
    return policy_gradient.policy_loss_sums(
        logp, old_logp, None, batch.advantages, batch.mask, beta=0.0,
        eps_low=common.eps_low, eps_high=common.eps_high, aggregation=common.aggregation,
        max_tokens=common.max_tokens, importance_level=self.importance_level,
        sampler_weights=common.sampler_weights(batch))


def per_token(advantages: jax.Array | np.ndarray, mask: np.ndarray) -> np.ndarray:
  """[R] sequence advantages spread over each completion's tokens, [R, T] float32."""
  return (np.asarray(advantages)[:, None] * mask).astype(np.float32)
