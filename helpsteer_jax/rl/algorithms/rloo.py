"""REINFORCE with a leave-one-out baseline (HelpSteer2-Preference's recipe; TRL's
RLOOTrainer): the KL to the reference folded into each completion's reward, the
advantage its reward minus the mean of the other samples of its prompt.

Two forms of the loss (`rloo_form`): "token", the clipped ratio per token averaged over
the batch's tokens (NeMo-Aligner's REINFORCE actor at ratio 1); "trl", TRL 1.9
RLOOTrainer's: one ratio per completion, exp of the sum of its token log-ratios,
clipped per completion, averaged over completions, and the whitening eps 1e-4."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from helpsteer_jax.losses import advantages as adv_lib
from helpsteer_jax.rl.algorithms.base import Algorithm, per_token

FORMS = ("token", "trl")


@dataclasses.dataclass(frozen=True)
class RLOO(Algorithm):
  name: ClassVar[str] = "rloo"
  min_samples: ClassVar[int] = 2
  default_aggregation: ClassVar[str] = "token"

  kl_coef: float = 0.05               # the sequence-level KL in the reward
  normalize_advantages: bool = False  # whiten over the batch
  rloo_form: str = "token"            # or "trl" (TRL RLOOTrainer's sequence ratio)

  def problems(self) -> list[str]:
    out = [f"loss.kl_coef={self.kl_coef} must be >= 0"] if self.kl_coef < 0 else []
    if self.rloo_form not in FORMS:
      out.append(f"loss.rloo_form={self.rloo_form!r}: choose one of {', '.join(FORMS)}")
    return out

  @property
  def uses_reference(self) -> bool:
    return self.kl_coef > 0

  @property
  def importance_level(self) -> str:
    return "sequence_sum" if self.rloo_form == "trl" else "token"

  @property
  def required_aggregation(self) -> str | None:
    # TRL's per-completion loss is its completion's mean over its (equal) token losses.
    return "sequence" if self.rloo_form == "trl" else None

  def shape_scores(self, scores, logp, ref_logp, mask):
    if not self.kl_coef:
      return scores
    return np.asarray(adv_lib.with_kl_penalty(scores, logp, ref_logp, mask, self.kl_coef))

  def advantages(self, rows: dict[str, np.ndarray], scores: np.ndarray, k: int,
                 logp: np.ndarray, ref_logp: np.ndarray, critic: Any = None) -> np.ndarray:
    adv = adv_lib.rloo_advantages(jnp.asarray(scores, jnp.float32), k,
                                  self.normalize_advantages,
                                  eps=1e-4 if self.rloo_form == "trl" else 1e-8)
    return per_token(adv, rows["mask"])
