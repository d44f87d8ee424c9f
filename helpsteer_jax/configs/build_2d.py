"""Build HelpSteer-2D supervision: pairs -> segments -> attribute-model scores.

  helpsteer-jax --config=configs/attribute_model.py      # train the demo RM
  helpsteer-jax --config=configs/build_2d.py             # score the demo pairs
  helpsteer-jax --config=configs/build_2d.py:llama3_70b \
      --config.init.checkpoint=/runs/attribute_model --config.tokenizer=/models/Meta-Llama-3-70B \
      --config.data.input_path=/data/helpsteer2/train.jsonl.gz

Input: HelpSteer2 rows (paired by prompt, higher helpfulness chosen), HelpSteer2
preference rows, or prompt/chosen/rejected JSONL; "" = the 2D demo pairs' texts.
`scorer.factory` is `attribute_model` (the project's attribute model from
`init.checkpoint` / `model.hf_path`, on the mesh; presets as for annotate),
`http` (a configs/serve.py server's attribute model, `scorer.checkpoint` its
base URL) or "package.module:function", a function taking `config.scorer` and
returning a scorer: texts -> [n, 9] attribute predictions (see
inference/attribute_scorer.py).
"""

import ml_collections

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
  config = config_base.base_config("build_2d")
  config.data = ml_collections.ConfigDict(dict(
      input_path="",          # "" = the 2D demo pairs' prompt/chosen/rejected texts
      split="train", on_bad_record="error",
      output_path="",         # "" = <workdir>/helpsteer_2d.jsonl
      max_pairs=0,            # 0 = all
      demo_rows=64,
      score_max=4.0,
      truncation="truncate_left",  # or "drop": prefixes longer than score.max_len
      add_bos=True))
  config.scorer = scorer_section()
  # an attribute_model workdir / Orbax checkpoint, or its HF export (<workdir>/hf)
  config.init = init_config(checkpoint="workdir/attribute_model")
  config.score = score_config()
  config.segment_score = "in_context"  # or "prefix_difference"
  return scoring_preset(config, preset)
