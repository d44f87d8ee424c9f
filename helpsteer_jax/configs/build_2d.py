"""Build HelpSteer-2D supervision: pairs -> segments -> attribute-model scores.

  helpsteer-jax --config=configs/attribute_model.py      # train the demo RM
  helpsteer-jax --config=configs/build_2d.py             # score the demo pairs
  helpsteer-jax --config=configs/build_2d.py:llama3_70b \
      --config.scorer.source=/runs/attribute_model \
      --config.scorer.tokenizer=/models/Meta-Llama-3-70B \
      --config.data.input_path=/data/helpsteer2/train.jsonl.gz

Input: HelpSteer2 rows (paired by prompt, higher helpfulness chosen), HelpSteer2
preference rows, or prompt/chosen/rejected JSONL; "" = the 2D demo pairs' texts.
`scorer.source` is the attribute model: an attribute_model workdir or its HF
export (on the mesh; presets as for annotate), a configs/serve.py server's base
URL, or "package.module:function", a factory taking `config.scorer` and
returning a function conversations -> [n, 9] attribute predictions (see
scoring/load.py).
"""

import ml_collections

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
  config = config_base.base_config("build_2d")
  del config.model, config.init, config.tokenizer  # the attribute model's are config.scorer's
  config.data = ml_collections.ConfigDict(dict(
      input_path="",          # "" = the 2D demo pairs' prompt/chosen/rejected texts
      split="train", on_bad_record="error",
      output_path="",         # "" = <workdir>/helpsteer_2d.jsonl
      max_pairs=0,            # 0 = all
      demo_rows=64,
      score_max=4.0))
  config.scorer = scorer_section(source=ATTRIBUTE_MODEL_RUN)
  config.segment_score = "in_context"  # or "prefix_difference"
  return scoring_preset(config, preset)
