"""An OpenAI-compatible server for a SteerLM model (chat, completions, rewards).

  # the default AC-SFT run's model on http://127.0.0.1:8000/v1
  helpsteer-jax --config=configs/serve.py --config.init.source=workdir/acsft
  # an HF directory, sampled by default as OpenAI's API, with the attribute model's rewards
  helpsteer-jax --config=configs/serve.py --config.init.source=workdir/acsft/hf \
      --config.scorer.source=workdir/attribute_model
  # a published SteerLM model, tensor-parallel over 8 devices, behind an API key
  HELPSTEER_API_KEY=secret helpsteer-jax --config=configs/serve.py:llama3_70b \
      --config.init.source=/models/Llama3-70B-SteerLM-Chat

Presets as configs/generate.py: the default (the demo `tiny` model, labels
with the five HelpSteer attributes), `llama2_70b`, `llama3_70b`, `llama3_8b`,
`smollm2_135m`.
"""

import ml_collections

from helpsteer_jax import config_base
from helpsteer_jax.config_sections import (
  DEFAULT_STOP_STRINGS,
  DEFAULT_SYSTEM,
  scorer_section,
  steer_config,
)

PRESETS = ("demo", "llama2_70b", "llama3_70b", "llama3_8b", "smollm2_135m")
RENAMED = {**config_base.MODEL_RENAMED,
           "reward.checkpoint": "scorer.source", "reward.model.hf_path": "scorer.source",
           "reward.pad_multiple": "removed: scoring pads to fixed length buckets"
                                  " (scorer.max_len)",
           "reward": "scorer"}


def get_config(preset: str = ""):
  config = config_base.base_config("serve")
  config.system = DEFAULT_SYSTEM  # when a chat request has no system message
  config.add_bos = True
  config.stop_strings = tuple(DEFAULT_STOP_STRINGS)
  # Request defaults (OpenAI's: temperature 1, top_p 1); temperature 0 is greedy.
  config.sampling = ml_collections.ConfigDict(dict(temperature=1.0, top_p=1.0))
  config.steer = steer_config()
  config.steer_attributes = ""  # "": the model export's (else all nine); or a list
  config.mesh = config_base.mesh_config(data=1, fsdp=1, tensor=-1)
  # A restart reads the warmed-up programs instead of compiling them (docs/tasks/serve.md).
  config.compile_cache = config_base.compile_cache_section("workdir")
  config.serve = ml_collections.ConfigDict(dict(
      host="127.0.0.1", port=8000,
      model_name="",         # "" = the model directory's name
      api_key="",            # "" = $HELPSTEER_API_KEY; both empty = no key
      allow_no_key=False,    # serve without a key on a non-loopback host (refused otherwise)
      allowed_hosts="",      # Host names answered, comma-separated; "" = loopback + host; "*"
      max_request_bytes=0,   # 0 = 32 bytes per token of max_length, at least 1 MiB
      max_batch=16,          # rows decoded together
      max_length=0,          # tokens per row (prompt + completion); 0 = max_position_embeddings
      chunk_steps=8,         # decode steps between scheduling rounds
      prefill_chunk=64,      # prompt tokens per decode step while rows run; 0: alone
      max_tokens=1024,       # the largest max_tokens a request may ask for
      max_n=8,
      warmup=True,           # compile every shape before listening
      drain_seconds=60))     # SIGTERM: how long in-flight requests may take to finish
  # The attribute model behind /v1/rewards (none while scorer.source is empty).
  config.scorer = scorer_section(batch_size=8)
  if preset in ("", "demo"):
    config.model = config_base.model_section("tiny")
    config.serve.max_length = 1024
    return config
  if preset in PRESETS:
    # bfloat16 on accelerators, float32 on CPU (runtime.decode_dtype says why).
    config.model = config_base.model_section(preset, dtype="auto", param_dtype="auto")
    config.serve.max_length = 4096
    config.require_weights = preset != "smollm2_135m"
    return config
  raise config_base.unknown_preset("serve", preset, PRESETS)
