"""The settings every generating task shares (generate, evaluate_generation): the model
to load, the prompt format, decoding and the attributes to ask for, per model preset."""

from __future__ import annotations

import ml_collections

from helpsteer_jax import config_base
from helpsteer_jax.data.template import DEFAULT_SYSTEM
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.generator import DEFAULT_STOP_STRINGS

PRESETS = ("demo", "llama2_70b", "llama3_70b", "llama3_8b", "smollm2_135m")


def generation_config(task: str, preset: str = "") -> ml_collections.ConfigDict:
  """`task`'s base config with the model of `preset` and the decoding settings.

  The default preset is the `tiny` model of the default AC-SFT run (its
  checkpoints carry their own shapes); the others load bf16 weights
  tensor-parallel over every device.
  """
  config = config_base.base_config(task)
  config.checkpoint = ""       # a training workdir or its checkpoints/ (Orbax)
  config.checkpoint_step = -1  # -1 = the latest
  config.system = DEFAULT_SYSTEM
  config.batch_size = 16
  config.max_new_tokens = 128
  config.max_length = 0        # KV cache length; 0 = the model's max_position_embeddings
  config.add_bos = True
  config.stop_strings = tuple(DEFAULT_STOP_STRINGS)
  config.sampling = ml_collections.ConfigDict(dict(temperature=0.0, top_k=0, top_p=1.0))
  # Unset values and an empty steer_attributes take the model's own (the `steerlm`
  # section of its export), else NeMo's defaults for all nine attributes.
  config.steer = steering.steer_config()
  config.steer_attributes = ""  # "", "all", "helpsteer" or a comma-separated list
  if preset in ("", "demo"):
    config.model = config_base.model_section("tiny")
    return config
  if preset in PRESETS:
    config.model = config_base.model_section(preset, dtype="bfloat16", param_dtype="bfloat16")
    config.mesh = config_base.mesh_config(data=1, fsdp=1, tensor=-1)
    config.max_new_tokens = 512
    config.max_length = 4096
    config.require_hf_path = preset != "smollm2_135m"
    return config
  raise config_base.unknown_preset(task, preset, PRESETS)
