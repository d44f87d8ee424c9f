"""The starting policy of the tasks that align one (preference training, online RL).

The policy comes from `init.source` (an HF directory or an AC-SFT run) or a fresh
`model.name`, built by `load.model.load_model`; its steerable attributes are those its
source declares (`weights.steer_spec`). Under LoRA the source's weights are the frozen
base and fresh adapters start at zero, so the model with its adapters off is the
starting policy (the reference, with no second copy of the weights).
"""

from __future__ import annotations

import ml_collections

from helpsteer_jax import runtime, weights
from helpsteer_jax.data import chat_template
from helpsteer_jax.load import model as loader
from helpsteer_jax.train import state as state_lib


def source_spec(config: ml_collections.ConfigDict) -> chat_template.SteerSpec:
  """The steerable attributes of the policy's source (`weights.steer_spec`, the one rule);
  a source without a `steerlm` section (or a fresh model) has none."""
  return weights.steer_spec(config) or chat_template.NO_LABELS


def load_policy(config: ml_collections.ConfigDict,
                rt: runtime.Runtime) -> tuple[state_lib.ModelParts, bool]:
  """(the starting policy split for training, whether its LoRA adapters are fresh: not
  read from `model.lora.adapter`, so that with them off it is the starting policy)."""
  model = loader.load_model(config, rt, loader.TRAIN)
  return (state_lib.split_model(model, rt.mesh, rt.rules),
          not config.model.lora.get("adapter"))
