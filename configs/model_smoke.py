"""Build the model on the mesh and run one forward pass.

  python -m helpsteer_jax.main --config=configs/model_smoke.py
  python -m helpsteer_jax.main --config=configs/model_smoke.py:llama3_8b \
      --config.model.hf_path=/path/to/Meta-Llama-3-8B
"""

from helpsteer_jax import config_base


def get_config(preset: str = "tiny"):
  config = config_base.base_config("model_smoke")
  config.model = config_base.model_section(preset)
  config.prompt = "What is the capital of France?"
  config.batch_size = 8
  return config
