"""The starting policy of the tasks that align one (preference training, online RL).

The policy comes from `init.hf_path`, an AC-SFT run (`init.checkpoint`) or a
fresh `model.name`; its steerable attributes are those its source's export
declares. Under LoRA the source's weights are the frozen base and fresh
adapters start at zero, so the model with its adapters off is the starting
policy (the reference, with no second copy of the weights).
"""

from __future__ import annotations

import ml_collections

from helpsteer_jax import config_base, runtime, saved_params, weights
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.data import chat_template
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.train import state as state_lib


def source_spec(config: ml_collections.ConfigDict) -> chat_template.SteerSpec:
  """The steerable attributes of the policy's source (`weights.steer_spec`, the one rule);
  a source without a `steerlm` section (or a fresh model) has none."""
  return weights.steer_spec(config) or chat_template.NO_LABELS


def restore_policy(parts: state_lib.ModelParts, run: str, step: int = -1) -> bool:
  """The starting policy from an AC-SFT run's checkpoint (`step`; -1: the latest): its
  parameters, or under LoRA its whole model as the frozen base (its adapters, if it
  trained LoRA: then True)."""
  saved, step = saved_params.param_shapes(run, step)
  saved_lora = any(any(k.endswith("_lora") for k in path) for path in saved)
  if parts.base and not saved_lora:
    parts.base = saved_params.restore_params(
        run, sharding_lib.abstract_arrays(parts.base, parts.base_shardings), step)[0]
    return False
  if saved_lora and not parts.base:
    raise ConfigError(f"{run} trained LoRA adapters: set model.lora.adapter=<its adapter"
                      " directory> with init.hf_path=<its base>, or export it merged"
                      " (train.export_merged) and start from that init.hf_path")
  parts.params = saved_params.restore_params(
      run, sharding_lib.abstract_arrays(parts.params, parts.param_shardings), step)[0]
  return saved_lora


def load_policy(config: ml_collections.ConfigDict,
                rt: runtime.Runtime) -> tuple[state_lib.ModelParts, bool]:
  """(the starting policy split for training, whether its LoRA adapters are fresh). An
  AC-SFT run's shapes (its vocabulary with the added SteerLM tokens, say) are read from
  its checkpoint (`weights.shaped_config`)."""
  cfg = None
  if config.init.checkpoint:
    shapes, _ = saved_params.param_shapes(config.init.checkpoint, config.init.step)
    if not any(k.endswith("_lora") for path in shapes for k in path):  # whole weights
      explicit = [k for k in config_base.SHAPE_FIELDS if config.model.get(k) is not None]
      cfg = weights.shaped_config(shapes, runtime.model_config(config), explicit)
  parts = state_lib.split_model(runtime.build_model(config, rt, cfg), rt.mesh, rt.rules)
  fresh = True
  if config.init.checkpoint:
    fresh = not restore_policy(parts, config.init.checkpoint, config.init.step)
  return parts, fresh
