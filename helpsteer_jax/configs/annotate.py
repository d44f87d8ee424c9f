"""Annotation (SteerLM step 2): label every assistant turn with the attribute model.

  helpsteer-jax --config=configs/attribute_model.py      # train the demo RM
  helpsteer-jax --config=configs/annotate.py             # label the demo data
  helpsteer-jax --config=configs/annotate.py:llama3_70b \
      --config.init.checkpoint=/runs/attribute_model --config.tokenizer=/models/Meta-Llama-3-70B \
      --config.data.input_path=/data/oasst/train.jsonl \
      --config.data.output_path=/data/oasst/train_labeled.jsonl

With a configs/serve.py server that loaded the attribute model, the scoring can
run there instead: --config.scorer.factory=http
--config.scorer.checkpoint=http://127.0.0.1:8000/v1.

Rerunning the same command resumes: rows already in the output are kept and
only the rest are appended.
"""

from helpsteer_jax import config_base
from helpsteer_jax.reward_runtime import (
  SCORING_PRESETS,
  init_config,
  score_config,
  scorer_section,
  scoring_preset,
)

PRESETS = SCORING_PRESETS


def get_config(preset: str = ""):
  config = config_base.base_config("annotate")
  config.data = config_base.data_config(
      input_path="",          # SteerLM jsonl or HelpSteer rows; "" = the demo data
      input_split="train",
      output_path="",         # "" = <workdir>/annotated.jsonl
      max_rows=0,             # 0 = all
      chunk_rows=512)         # conversations scored and appended (fsync'd) at a time
  # an attribute_model workdir / Orbax checkpoint, or its HF export (<workdir>/hf)
  config.init = init_config(checkpoint="workdir/attribute_model")
  config.score = score_config()
  # attribute_model (init.checkpoint, on the mesh), http (scorer.checkpoint: a server's
  # base URL), demo_rules or package.module:function
  config.scorer = scorer_section()
  config.attributes = ""      # comma-separated subset to write; "" = all nine
  return scoring_preset(config, preset)
