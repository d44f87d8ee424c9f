"""Annotation (SteerLM step 2): label every assistant turn with the attribute model.

  helpsteer-jax --config=configs/attribute_model.py      # train the demo RM
  helpsteer-jax --config=configs/annotate.py             # label the demo data
  helpsteer-jax --config=configs/annotate.py:llama3_70b \
      --config.scorer.source=/runs/attribute_model \
      --config.scorer.tokenizer=/models/Meta-Llama-3-70B \
      --config.data.input_path=/data/oasst/train.jsonl \
      --config.data.output_path=/data/oasst/train_labeled.jsonl

`scorer.source` is where the attribute model is: an attribute_model workdir or its
HF export, a configs/serve.py server that loaded one (http://127.0.0.1:8000/v1), or
package.module:function (scoring/load.py).

Rerunning the same command resumes: rows already in the output are kept and
only the rest are appended.
"""

from helpsteer_jax import config_base
from helpsteer_jax.config_sections import (
  ATTRIBUTE_MODEL_RUN,
  SCORING_PRESETS,
  SCORING_RENAMED,
  scorer_section,
  scoring_preset,
)

PRESETS = SCORING_PRESETS
RENAMED = SCORING_RENAMED


def get_config(preset: str = ""):
  config = config_base.base_config("annotate")
  del config.model, config.init, config.tokenizer  # the attribute model's are config.scorer's
  config.data = config_base.data_config(
      input_path="",          # SteerLM jsonl or HelpSteer rows; "" = the demo data
      input_split="train",
      output_path="",         # "" = <workdir>/annotated.jsonl
      max_rows=0,             # 0 = all
      chunk_rows=512)         # conversations scored and appended (fsync'd) at a time
  for key in ("truncation", "add_bos", "packing"):  # the scorer's (scorer.truncation, ...)
    del config.data[key]
  config.scorer = scorer_section(source=ATTRIBUTE_MODEL_RUN)
  config.attributes = ""      # comma-separated subset to write; "" = all nine
  return scoring_preset(config, preset)
