"""The training path's log-probability pass over an iteration's rollout rows.

Before the update an iteration may need, [R, T] on the rollout tokens, the
sampling policy's log-probabilities recomputed on the training path (several
optimizer steps per batch, or top-p/top-k truncating the sampler: the
sampler's own differ by kernel and cache numerics, and the first update's
ratio must be exactly 1) and the reference's (an algorithm whose loss or
reward reads it). Both run as one `frozen_pass.FrozenPass` over the rows,
dispatched before scoring so that the devices compute while the host
prepares the scorer's batches, and fetched when the advantages need them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax.sharding import NamedSharding

from helpsteer_jax import frozen_pass, runtime
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.rl import objective, rollout
from helpsteer_jax.rl.settings import RLSettings
from helpsteer_jax.train import state as state_lib

FIELDS = ("inputs", "targets", "positions", "segment_ids", "at")


class LogprobPass:
  """The old and reference log-prob pass of `settings` (`reference`: a (params,
  shardings) pair of a frozen copy, "adapters_off", or None for no reference)."""

  def __init__(self, parts: state_lib.ModelParts, rt: runtime.Runtime, settings: RLSettings,
               reference: Any, param_shardings: Any, rows: NamedSharding, micro_batch: int,
               chunk: int):
    s, rules = settings, rt.rules
    self.settings = s
    self.with_ref = s.uses_reference and reference is not None
    with_old = s.recomputes_old_logp and not s.max_staleness
    self._frozen = () if reference in (None, "adapters_off") else (reference[0],)
    frozen_shardings = () if not self._frozen else (reference[1],)
    self._active = with_old or self.with_ref
    with_ref = self.with_ref

    def logprobs(params, base, *args):
      *ref, batch = args
      with sharding_lib.axis_rules(rules):
        model = state_lib.merge_model(parts, params, base)
        out = {}
        if with_old:
          out["old"] = objective.completion_logprobs(model, batch, chunk, s.temperature)
        if with_ref:
          out["ref"] = objective.reference_logprobs(model, batch, ref[0] if ref else None,
                                                    chunk, s.temperature)
        return out

    self._pass = frozen_pass.FrozenPass(
        logprobs, rt.mesh, rows, micro_batch,
        (param_shardings, parts.base_shardings, *frozen_shardings))

  def dispatch(self, params: Any, base: Any, rows: dict[str, np.ndarray]) -> list:
    """Starts the pass over `objective.pack`'s rows with the policy's `params`; the
    pending outputs ([] when the iteration needs neither)."""
    if not self._active:
      return []
    return self._pass.batches((params, base, *self._frozen), {k: rows[k] for k in FIELDS})

  def fetch(self, pending: list, r: rollout.Rollouts, behaviour: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, bool]:
    """[R, T] log-probs of the rollout tokens under the sampling policy and the reference
    (zeros without one), and whether the former were recomputed (else the sampler's;
    `behaviour`: computed on the rollout side, `rl.off_policy`)."""
    s = self.settings
    outs = frozen_pass.FrozenPass.fetch(pending) if pending else {}
    old = (behaviour if behaviour is not None
           else outs["old"] if s.recomputes_old_logp else r.sampler_logp)
    ref = outs["ref"] if "ref" in outs else np.zeros_like(old)
    return old, ref, s.recomputes_old_logp
