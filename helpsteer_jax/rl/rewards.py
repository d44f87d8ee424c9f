"""Rewards of rollouts from the attribute model's predictions.

- The weighted reward of the nine predicted attributes (`scoring.rewards`;
  the HelpSteer2 paper's PPO used 0.65 helpfulness + 0.8 correctness + 0.45
  coherence), normalised by a fixed mean and std (the paper normalises by
  the training data's) or by running moments
  over the rewards seen so far (`RunningMoments`, TRL's and NeMo's).
- The scores the advantages read (`iteration_scores`): the run's normalisation,
  less the truncation penalty, with the algorithm's length shaping.
- The steering term, for prompts that request attribute values (SteerLM
  labels): minus `coef` times the mean absolute distance between the
  predicted and the requested values of the steerable attributes, so RL
  makes steering more faithful instead of erasing it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from helpsteer_jax.data.records import ATTRIBUTES, STEERABLE
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.losses import advantages as adv_lib
from helpsteer_jax.scoring import rewards as rewards_lib

if TYPE_CHECKING:
  from helpsteer_jax.rl.settings import RLSettings


def steering_distance(preds: np.ndarray, requested: Sequence[Mapping[str, float] | None],
                      attributes: Sequence[str] = STEERABLE) -> np.ndarray:
  """[B] mean |predicted - requested| over the `attributes` each row requests (0 for a
  row that requests none of them)."""
  out = np.zeros(len(preds), np.float64)
  for i, (pred, want) in enumerate(zip(preds, requested)):
    names = [a for a in attributes if want and a in want]
    if names:
      out[i] = np.mean([abs(pred[ATTRIBUTES.index(a)] - want[a]) for a in names])
  return out


@dataclasses.dataclass
class RunningMoments:
  """Mean and std of every reward seen so far (Chan et al.'s parallel update)."""

  count: int = 0
  mean: float = 0.0
  m2: float = 0.0

  def update(self, x: np.ndarray) -> None:
    n, mean = len(x), float(np.mean(x))
    delta, total = mean - self.mean, self.count + len(x)
    self.m2 += float(np.sum((x - mean) ** 2)) + delta ** 2 * self.count * n / total
    self.mean += delta * n / total
    self.count = total

  @property
  def std(self) -> float:
    """The sample std; 1 while every reward so far is equal (up to float rounding, which
    would otherwise be scaled up), so that equal rewards standardise to about 0."""
    std = float(np.sqrt(max(self.m2, 0.0) / (self.count - 1))) if self.count > 1 else 0.0
    return std if std > 1e-6 * max(1.0, abs(self.mean)) else 1.0


def rollout_rewards(preds: np.ndarray, weights: Mapping[str, float], *,
                    requested: Sequence[Mapping[str, float] | None] | None = None,
                    steer_coef: float = 0.0, mean: float | None = 0.0, std: float = 1.0,
                    moments: RunningMoments | None = None,
                    attributes: Sequence[str] = STEERABLE, unscored: str = "") -> np.ndarray:
  """[B] rewards of [B, 9] predictions: the weighted reward, standardised by (`mean`,
  `std`), or, with `mean=None`, by `moments` updated with this batch first; minus
  `steer_coef` times the steering distance to `requested` over `attributes`. A rollout
  not scored (NaN) stops the run, with `unscored`: why the reward source left it so."""
  if np.isnan(preds).any():
    rows = np.flatnonzero(np.isnan(preds).any(axis=1)).tolist()
    raise ConfigError(f"the reward source could not score rollouts {rows}:"
                      f" {unscored or 'it returned NaN for them'}")
  reward = rewards_lib.rewards(preds, weights)
  if mean is None:
    if moments is None:
      raise ConfigError("running reward normalisation needs a RunningMoments")
    moments.update(reward)
    mean, std = moments.mean, moments.std
  reward = (reward - mean) / std
  if steer_coef:
    if requested is None:
      raise ConfigError("the steering reward needs each rollout's requested attributes")
    reward = reward - steer_coef * steering_distance(preds, requested, attributes)
  return reward


def iteration_scores(preds: np.ndarray, weights: np.ndarray,
                     requested: Sequence[Mapping[str, float] | None], finished: np.ndarray,
                     longest: np.ndarray, s: RLSettings, moments: RunningMoments
                     ) -> tuple[np.ndarray, np.ndarray]:
  """[R] rewards (`reward.normalize`'s standardisation, the steering term) and [R] scores
  for the advantages: less the truncation penalty where a completion did not `finish`,
  with the algorithm's shaping of the `longest` answer's length."""
  if s.normalize == "running":
    reward = rollout_rewards(preds, weights, requested=requested, steer_coef=s.steer_coef,
                             mean=None, moments=moments, attributes=s.steer_attributes,
                             unscored=s.unscored)
  else:
    mean, std = (s.reward_mean, s.reward_std) if s.normalize == "fixed" else (0.0, 1.0)
    reward = rollout_rewards(preds, weights, requested=requested, steer_coef=s.steer_coef,
                             mean=mean, std=std, attributes=s.steer_attributes,
                             unscored=s.unscored)
  scores = reward
  if s.truncation_penalty:
    scores = np.asarray(adv_lib.truncation_penalty(scores, finished, s.truncation_penalty))
  return reward, s.algorithm.length_scores(scores, longest, s.max_new_tokens)
