"""Reward-model evaluation: attribute metrics, pairwise accuracy and the RM benchmarks.

  helpsteer-jax --config=configs/attribute_model.py      # train the demo RM
  helpsteer-jax --config=configs/evaluate_rm.py          # evaluate it (demo data)
  helpsteer-jax --config=configs/evaluate_rm.py:llama3_70b \
      --config.scorer.source=/runs/attribute_model \
      --config.scorer.tokenizer=/models/Meta-Llama-3-70B \
      --config.data.validation_path=/data/HelpSteer2 \
      --config.data.preference_path=/data/HelpSteer2 \
      --config.data.rewardbench_path=/data/reward-bench/filtered.parquet \
      --config.data.rm_bench_path=/data/RM-Bench/data/total_dataset.json \
      --config.data.judgebench_path=/data/judgebench_gpt-4o.jsonl \
      --config.data.rewardbench2_path=/data/reward-bench-2/data/test-00000-of-00001.parquet

`scorer.source` is the attribute model evaluated: an attribute_model workdir or
its HF export (or any scorer source: a server URL, package.module:function).
The reward of a response is its predicted attributes . `scorer.weights`
(default: HelpSteer2's, the Llama3-70B-SteerLM-RM weights; for a Bradley-Terry
model weigh its slot alone, e.g. --config.scorer.weights.helpfulness=1 and the
others 0). `variants` compares several in one table:

  helpsteer-jax --config=configs/evaluate_rm.py --config.variants=\
regression=workdir/attribute_model,scaled_bt=workdir/attribute_model_bt@helpfulness,\
expo_0.3=workdir/expo/alpha_0.3@helpfulness
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
RENAMED = {**SCORING_RENAMED,
           "reward_weights": "removed: give --config.scorer.weights.<attribute>=<weight>"}


def get_config(preset: str = ""):
  config = config_base.base_config("evaluate_rm")
  del config.model, config.init, config.tokenizer  # the attribute model's are config.scorer's
  config.data = config_base.data_config(
      preference_path="",       # HelpSteer2 preference file or directory
      preference_split="validation",  # rows of this `split` ("" = all)
      rewardbench_path="",      # RewardBench file (prompt, chosen, rejected, subset)
      rewardbench_split="filtered",
      helpsteer3_path="",       # HelpSteer3 directory (preference/<split>.jsonl.gz) or file
      helpsteer3_split="validation",
      domains="", languages="",  # HelpSteer3's rows of these (comma-separated; "" = all)
      rm_bench_path="",         # RM-Bench's total_dataset.json (a JSON list) or JSONL
      judgebench_path="",       # a JudgeBench data/dataset=judgebench,*.jsonl file
      rewardbench2_path="",     # RewardBench 2 parquet / JSONL file, directory or hub id
      rewardbench2_split="test")
  for key in ("truncation", "add_bos", "packing"):  # the scorer's (scorer.truncation, ...)
    del config.data[key]
  config.scorer = scorer_section(source=ATTRIBUTE_MODEL_RUN)
  # Several reward models in one table (pairs only), instead of scorer.source:
  # "name=source,name=source@attribute" (@attribute: that slot alone is the reward, a BT
  # model's bt_attribute; otherwise scorer.weights). scorer.* is every variant's setting.
  config.variants = ""
  return scoring_preset(config, preset)
