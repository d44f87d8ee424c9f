"""Steering sweeps: each steerable attribute at every value 0..4, the others at their
defaults, on a prompt set; mean words, sentences and tokens per setting, and with an
attribute model its predictions.

  # the default AC-SFT run's model on the 50 held-out demo prompts
  helpsteer-jax --config=configs/steering_sweep.py \
      --config.init.source=workdir/acsft
  # MT-Bench's first turns, with the attribute model's predictions
  helpsteer-jax --config=configs/steering_sweep.py:llama3_70b \
      --config.init.source=/models/Llama3-70B-SteerLM-Chat \
      --config.mt_bench.questions=/data/mt_bench/question.jsonl \
      --config.scorer.source=/runs/attribute_model \
      --config.sweep.attributes=verbosity,complexity

Writes <workdir>/sweep_generations.jsonl (rerunning the same command resumes it),
sweep.json, sweep.md and sweep.png. Model loading, decoding, steering and the presets
are configs/generate.py's.
"""

import pathlib
import runpy

import ml_collections

from helpsteer_jax.config_base import MODEL_RENAMED
from helpsteer_jax.config_sections import GENERATION_PRESETS

PRESETS = GENERATION_PRESETS  # generate's
RENAMED = {**MODEL_RENAMED, "scorer": "scorer.source"}


def get_config(preset: str = ""):
  generate = runpy.run_path(str(pathlib.Path(__file__).with_name("generate.py")))
  config = generate["get_config"](preset)
  config.task = "steering_sweep"
  for key in ("mode", "output", "best_of_n"):  # generate's chat, output file, best-of-n
    del config[key]
  # Prompts: `input` (generate's .jsonl / text formats), else MT-Bench's first turns
  # (`mt_bench.questions`, FastChat's question.jsonl, or `mt_bench.dir`), else the 50
  # held-out demo prompts.
  config.mt_bench = ml_collections.ConfigDict(dict(dir="", questions=""))
  config.prompt_limit = 0       # the first N prompts; 0 = all
  config.sweep = ml_collections.ConfigDict(dict(
      attributes="",            # "" = the label's (the model's steerable ones); or a list
      scores="0,1,2,3,4"))      # the values asked for ("values" would shadow ConfigDict's)
  # scorer.source: an attribute model (workdir, HF reward directory or a serve URL),
  # demo_rules (the demo data's own rules), or "" = no predictions.
  config.scorer.source = ""
  return config
