"""Convert a trained attribute model (Orbax checkpoint) to an HF sequence-classification directory.

  helpsteer-jax --config=configs/attribute_model.py      # train the demo RM
  helpsteer-jax --config=configs/export_rm.py \
      --config.output=workdir/attribute_model_hf                         # convert it
  helpsteer-jax --config=configs/export_rm.py:llama3_70b \
      --config.init.source=/runs/attribute_model --config.tokenizer=/models/Meta-Llama-3-70B \
      --config.output=/models/Llama3-70B-attribute-model-hf

The output loads with `transformers.AutoModelForSequenceClassification` and is
accepted wherever a task takes an attribute model (`--config.scorer.source=<dir>`).
Presets: the model shapes of the evaluate_rm / annotate presets.
"""

from helpsteer_jax import config_base
from helpsteer_jax.config_sections import SCORING_PRESETS, init_config, scoring_preset

PRESETS = SCORING_PRESETS
RENAMED = config_base.MODEL_RENAMED


def get_config(preset: str = ""):
  config = config_base.base_config("export_rm")
  config.init = init_config(source="workdir/attribute_model")
  config.output = ""        # "" = <workdir>/hf
  config.dtype = "bfloat16"  # of the written tensors: bfloat16 | float32
  return scoring_preset(config, preset)
