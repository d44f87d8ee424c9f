"""Reward-model evaluation: attribute metrics, HelpSteer2-Preference and RewardBench accuracy.

  helpsteer-jax --config=configs/attribute_model.py      # train the demo RM
  helpsteer-jax --config=configs/evaluate_rm.py          # evaluate it (demo data)
  helpsteer-jax --config=configs/evaluate_rm.py:llama3_70b \
      --config.init.checkpoint=/runs/attribute_model --config.tokenizer=/models/Meta-Llama-3-70B \
      --config.data.validation_path=/data/HelpSteer2 \
      --config.data.preference_path=/data/HelpSteer2 \
      --config.data.rewardbench_path=/data/reward-bench/filtered.parquet

The reward of a response is its predicted attributes . `reward_weights`
(default: the Llama3-70B-SteerLM-RM weights; for a Bradley-Terry model use
the one-hot of its slot, e.g. helpfulness: 0,0,0,0,1,0,0,0,0).
"""

from helpsteer_jax import config_base
from helpsteer_jax.eval.rm_metrics import STEERLM_RM_WEIGHTS
from helpsteer_jax.reward_runtime import SCORING_PRESETS, init_config, score_config, scoring_preset

PRESETS = SCORING_PRESETS


def get_config(preset: str = ""):
  config = config_base.base_config("evaluate_rm")
  config.data = config_base.data_config(
      preference_path="",       # HelpSteer2 preference file or directory
      preference_split="validation",  # rows of this `split` ("" = all)
      rewardbench_path="",      # RewardBench file (prompt, chosen, rejected, subset)
      rewardbench_split="filtered")
  # an attribute_model workdir / Orbax checkpoint, or its HF export (<workdir>/hf)
  config.init = init_config(checkpoint="workdir/attribute_model")
  config.score = score_config()
  config.reward_weights = STEERLM_RM_WEIGHTS
  return scoring_preset(config, preset)
