"""Build the model on the mesh and run one forward pass.

  helpsteer-jax --config=configs/model_smoke.py
  helpsteer-jax --config=configs/model_smoke.py:llama3_8b \
      --config.init.source=/path/to/Meta-Llama-3-8B
"""

from helpsteer_jax import config_base
from helpsteer_jax.config_sections import MODEL_NAMES

PRESETS = MODEL_NAMES  # any named model (models/catalog.py); the default is tiny
RENAMED = config_base.MODEL_RENAMED


def get_config(preset: str = "tiny"):
  config = config_base.base_config("model_smoke")
  config.model = config_base.model_section(preset)
  config.prompt = "What is the capital of France?"
  config.batch_size = 8
  return config
