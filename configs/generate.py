"""Steerable generation (SteerLM inference) with a KV cache; best-of-n.

  # the default AC-SFT run's model, the 50 held-out demo prompts
  python -m helpsteer_jax.main --config=configs/generate.py \
      --config.checkpoint=workdir/acsft --config.steer.verbosity=0
  # a file of prompts, per-run attributes, sampling, best-of-4
  python -m helpsteer_jax.main --config=configs/generate.py \
      --config.model.hf_path=workdir/acsft/hf --config.input=prompts.jsonl \
      --config.sampling.temperature=0.7 --config.best_of_n.n=4
  # interactive chat
  python -m helpsteer_jax.main --config=configs/generate.py \
      --config.checkpoint=workdir/acsft --config.mode=chat
  # a published SteerLM model, tensor-parallel over 8 devices
  python -m helpsteer_jax.main --config=configs/generate.py:llama2_70b \
      --config.model.hf_path=/models/Llama2-70B-SteerLM-Chat --config.input=-

Rerunning the same file-mode command resumes: rows already in the output are
kept and only the rest are appended (with the seeds an uninterrupted run uses).

Presets: the default (the `tiny` preset of the default AC-SFT run, whose
checkpoints carry their own shapes), `llama2_70b`, `llama3_70b`, `llama3_8b`
and `smollm2_135m`. The label carries the attributes the model's export
declares (the five HelpSteer ones for the demo AC-SFT run), else all nine as
NeMo's SteerLM models; `--config.steer_attributes` overrides.
"""

import ml_collections

from helpsteer_jax import config_base
from helpsteer_jax.data.template import DEFAULT_SYSTEM
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.best_of_n import HELPSTEER2_WEIGHTS
from helpsteer_jax.inference.generator import DEFAULT_STOP_STRINGS


def get_config(preset: str = ""):
  config = config_base.base_config("generate")
  config.checkpoint = ""       # a training workdir or its checkpoints/ (Orbax)
  config.checkpoint_step = -1  # -1 = the latest
  config.mode = "file"         # "file" or "chat"
  config.input = ""            # .jsonl / text file, "-" = stdin, "" = held-out demo prompts
  config.output = ""           # "" = <workdir>/generations.jsonl
  config.system = DEFAULT_SYSTEM
  config.batch_size = 16
  config.max_new_tokens = 128
  config.max_length = 0        # KV cache length; 0 = the model's max_position_embeddings
  config.add_bos = True
  config.stop_strings = tuple(DEFAULT_STOP_STRINGS)
  config.sampling = ml_collections.ConfigDict(dict(temperature=0.0, top_k=0, top_p=1.0))
  # Unset values and an empty steer_attributes take the model's own (the `steerlm`
  # section of its export), else NeMo's defaults for all nine attributes.
  config.steer = steering.steer_config()
  config.steer_attributes = ""  # "", "all", "helpsteer" or a comma-separated list
  # scorer: demo_rules | attribute_model (scorer_path = an attribute_model workdir or its
  # HF export) | package.module:function (called with scorer_path)
  config.best_of_n = ml_collections.ConfigDict(dict(
      n=1, scorer="demo_rules", scorer_path="",
      weights=ml_collections.ConfigDict({name: HELPSTEER2_WEIGHTS.get(name, 0.0)
                                         for name in steering.NEMO_DEFAULTS})))
  if preset in ("", "demo"):
    config.model = config_base.model_section("tiny")
    return config
  if preset in ("llama2_70b", "llama3_70b", "llama3_8b", "smollm2_135m"):
    config.model = config_base.model_section(preset, dtype="bfloat16", param_dtype="bfloat16")
    config.mesh = config_base.mesh_config(data=1, fsdp=1, tensor=-1)
    config.max_new_tokens = 512
    config.max_length = 4096
    config.require_hf_path = preset != "smollm2_135m"
    return config
  raise ValueError(f"unknown generate preset {preset!r}; choose demo, llama2_70b,"
                   " llama3_70b, llama3_8b or smollm2_135m")
