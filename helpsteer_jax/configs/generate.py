"""Steerable generation (SteerLM inference) with a KV cache; best-of-n.

  # the default AC-SFT run's model, the 50 held-out demo prompts
  helpsteer-jax --config=configs/generate.py \
      --config.init.source=workdir/acsft --config.steer.verbosity=0
  # a file of prompts, per-run attributes, sampling, best-of-4
  helpsteer-jax --config=configs/generate.py \
      --config.init.source=workdir/acsft/hf --config.input=prompts.jsonl \
      --config.sampling.temperature=0.7 --config.best_of_n.n=4 \
      --config.scorer.source=workdir/attribute_model
  # interactive chat
  helpsteer-jax --config=configs/generate.py \
      --config.init.source=workdir/acsft --config.mode=chat
  # a published SteerLM model, tensor-parallel over 8 devices
  helpsteer-jax --config=configs/generate.py:llama2_70b \
      --config.init.source=/models/Llama2-70B-SteerLM-Chat --config.input=-

Rerunning the same file-mode command resumes: rows already in the output are
kept and only the rest are appended (with the seeds an uninterrupted run uses).

Presets: the default (the `tiny` model of the default AC-SFT run, whose
checkpoints carry their own shapes), `llama2_70b`, `llama3_70b`, `llama3_8b`
and `smollm2_135m`. The label carries the attributes the model's export
declares (the five HelpSteer ones for the demo AC-SFT run), else all nine as
NeMo's SteerLM models; `--config.steer_attributes` overrides.
"""

import ml_collections

from helpsteer_jax.config_base import MODEL_RENAMED
from helpsteer_jax.config_sections import GENERATION_PRESETS, generation_config, scorer_section

PRESETS = GENERATION_PRESETS
RENAMED = {**MODEL_RENAMED, "best_of_n.scorer": "scorer.source",
           "best_of_n.scorer_path": "scorer.source", "best_of_n.weights": "scorer.weights"}


def get_config(preset: str = ""):
  config = generation_config("generate", preset)
  config.mode = "file"         # "file" or "chat"
  config.input = ""            # .jsonl / text file, "-" = stdin, "" = held-out demo prompts
  config.output = ""           # "" = <workdir>/generations.jsonl
  config.best_of_n = ml_collections.ConfigDict(dict(n=1))  # > 1: the best of n samples
  # best-of-n's attribute model: demo_rules, an attribute_model workdir or its HF export,
  # a server URL or package.module:function; the reward weighs its predictions by weights
  config.scorer = scorer_section(source="demo_rules")
  return config
