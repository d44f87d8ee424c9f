"""The distillation teacher: loaded from `config.teacher` through the one model loader,
frozen, and run inside the policy's loss on the rollout rows (as TRL's GKDTrainer runs
its teacher in `compute_loss`).

`teacher.source` is an HF directory or any training task's Orbax run, as `init.source`
is; the teacher's shape is its own (its config.json, or the run's parameter shapes,
`teacher.model.*` where a run leaves one open), its dtype and mesh the policy's. It
must share the policy's vocabulary (and tokenizer: the rows are the policy's tokens).
A served teacher is not offered: the loss reads the teacher's whole next-token
distribution at every completion position, which `/v1/completions` does not return.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import ml_collections

from helpsteer_jax import runtime
from helpsteer_jax.config_base import SHAPE_FIELDS
from helpsteer_jax.data.batches import ROLLOUT_BATCH
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.load import model as loader
from helpsteer_jax.losses import distillation
from helpsteer_jax.rl import objective
from helpsteer_jax.rl.settings import RLSettings
from helpsteer_jax.train import state as state_lib


def check(config: ml_collections.ConfigDict, s: RLSettings) -> None:
  """Fails, saying what to set, when the algorithm needs a teacher and none is given."""
  if s.algorithm.needs_teacher and not config.teacher.source:
    raise ConfigError(f"algorithm={s.algorithm.name} distils a teacher into the policy: set"
                      " --config.teacher.source=<an HF directory or a training run of a"
                      " model with the policy's vocabulary>")


def teacher_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with the teacher as `init` and the teacher's own shape: the policy's shape
  fields cleared (`teacher.model.*` set them), no LoRA adapters."""
  tc = ml_collections.ConfigDict(config.to_dict())
  tc.init.source, tc.init.step = config.teacher.source, config.teacher.step
  own = config.teacher.get("model") or {}
  if own.get("name"):
    tc.model.name = own["name"]
  for name in SHAPE_FIELDS:
    tc.model[name] = own.get(name)
  tc.model.lora.rank, tc.model.lora.adapter = 0, ""
  return tc


@dataclasses.dataclass
class Teacher:
  """The frozen teacher: its parts (params are an argument of the train step)."""
  parts: state_lib.ModelParts

  @property
  def params(self) -> dict:
    return self.parts.params

  @property
  def shardings(self) -> dict:
    return self.parts.param_shardings

  def objective(self, settings: RLSettings, chunk_size: int) -> Callable:
    """The train loop's loss `(model, batch, teacher_params) -> (loss, sums)`."""
    return functools.partial(distill_objective, teacher=self.parts, settings=settings,
                             chunk_size=chunk_size)


def load(config: ml_collections.ConfigDict, rt: runtime.Runtime, vocab_size: int) -> Teacher:
  """The teacher of `config.teacher` on `rt`'s mesh; its vocabulary checked against the
  policy's `vocab_size` before any weight is read."""
  tc = teacher_config(config)
  cfg = runtime.model_config(tc)
  if cfg.vocab_size != vocab_size:
    raise ConfigError(f"teacher.source={config.teacher.source}: the teacher's vocabulary has"
                      f" {cfg.vocab_size} tokens, the policy's {vocab_size}; distillation"
                      " compares their next-token distributions, so they must share one")
  model = loader.load_model(tc, rt, loader.DECODE, cfg)
  return Teacher(state_lib.split_model(model, rt.mesh, rt.rules))


def distill_objective(model: Any, batch: dict[str, jax.Array], teacher_params: dict, *,
                      teacher: state_lib.ModelParts, settings: RLSettings,
                      chunk_size: int = 256) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(summed loss, sums) of rollout rows: the student's and the teacher's forward passes,
  the per-token reverse KL at the completion positions, the algorithm's loss."""
  s, b = settings, ROLLOUT_BATCH.view(batch)
  args = (batch["inputs"], batch["positions"], batch["segment_ids"])
  hidden = model(*args)
  t_model = state_lib.merge_model(teacher, teacher_params)
  t_hidden = jax.lax.stop_gradient(t_model(*args))
  kl = distillation.reverse_kl(
      distillation.at_positions(hidden, b.at), model.head_weight(),
      distillation.at_positions(t_hidden, b.at), t_model.head_weight(), chunk_size,
      s.temperature, model.cfg.final_logit_softcap, t_model.cfg.final_logit_softcap)
  if s.algorithm.reward_coef:  # only the reward's term reads the sampled tokens' log-probs
    logp = objective.hidden_logprobs(model, hidden, batch, chunk_size, s.temperature)
  else:
    logp = jax.lax.stop_gradient(kl) * 0.0
  old = b.old_logp if s.recomputes_old_logp else jax.lax.stop_gradient(logp)
  total, weight, sums = s.algorithm.loss_sums(logp, old, b, s.loss, teacher_kl=kl)
  sums["weight"] = weight
  return total, sums
