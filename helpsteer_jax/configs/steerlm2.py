"""SteerLM 2.0 (HelpSteer2 paper; NeMo-Aligner's train_steerlm2.py), iterations in one run.

  # the default AC-SFT run as Q', the demo rows' prompts and labels, the demo rules as
  # the attribute model: 2 iterations, each evaluated by a scored steering sweep
  helpsteer-jax --config=configs/acsft.py && helpsteer-jax --config=configs/steerlm2.py
  # Llama 3 70B from an AC-SFT model, HelpSteer2's prompts and labels, a trained
  # attribute model, the SFT model (no labels) as P(y|x)
  helpsteer-jax --config=configs/steerlm2.py:llama3_70b \\
      --config.init.source=/models/Llama-3-70B-SteerLM-HF \\
      --config.unconditional.source=/models/Llama-3-70B-SFT-HF \\
      --config.prompts.train_path=/data/helpsteer2/train.jsonl.gz \\
      --config.scorer.source=/runs/attribute_model_70b

Each iteration samples `sampling.responses` responses per prompt (at
`sampling.temperature`, 1 by default: the importance weights assume samples of
Q' itself) and writes them with log P(a|x,y), log P(y|x) and log Q'(y|a,x) to
`iteration_<i>/samples.jsonl`, then trains `train.num_steps` steps of
`train.global_batch` groups on them. `iterations` counts iterations (the paper: 2).

Presets: the default (the demo AC-SFT run's tiny policy), `llama3_70b`.
"""

import ml_collections

from helpsteer_jax import config_base
from helpsteer_jax.config_sections import (
  DEFAULT_SYSTEM,
  demo_policy,
  optimizer_config,
  rounds_sampling_config,
  scorer_on_mesh,
  scorer_section,
  steer_config,
  train_config,
)

PRESETS = ("demo", "llama3_70b")
RENAMED = {**config_base.MODEL_RENAMED, "unconditional.hf_path": "unconditional.source",
           "unconditional.checkpoint": "unconditional.source"}


def _demo(config):
  demo_policy(config, num_steps=40, global_batch=8, micro_batch=8, log_every=5,
              eval_every=0, save_every=20)
  config.optimizer = optimizer_config(lr=3e-5, schedule="constant", warmup_steps=0,
                                      weight_decay=0.0, grad_clip=1.0)
  config.sampling.responses = 8
  # The demo has no unconditional model: the AC-SFT policy never saw an unlabelled prompt.
  config.unconditional.with_label = True
  return config


def _llama3_70b(config):
  config.model = config_base.model_section("llama3_70b", dtype="bfloat16",
                                          param_dtype="float32", remat_policy="full")
  # NeMo-Aligner's SteerLM 2.0 example: lr 6e-6 for 200 constant steps, then to 5e-6;
  # 800 steps of global batch 128 responses, sequence length 4096.
  config.train = train_config(num_steps=800, global_batch=16, micro_batch=2, seq_len=4096,
                              log_every=1, eval_every=0, save_every=100, keep_checkpoints=2,
                              loss_chunk_size=512)
  config.optimizer = optimizer_config(lr=6e-6, min_lr=5e-6, constant_steps=200,
                                      warmup_steps=1, weight_decay=0.01, grad_clip=1.0)
  config.sampling.update(responses=8, max_new_tokens=1024, batch_prompts=64)
  config.prompts.per_iteration = 0
  config.mesh = config_base.mesh_config(data=1, fsdp=-1, tensor=8)
  scorer_on_mesh(config, "llama3_70b")
  config.eval.update(prompts=20, max_new_tokens=512, batch_size=64)
  config.require_weights = True
  return config


def get_config(preset: str = ""):
  config = config_base.base_config("steerlm2")
  config.iterations = 2
  config.prompts = ml_collections.ConfigDict(dict(
      # HelpSteer / HelpSteer2 rows (their prompts and labels), or with attributes=run a
      # .jsonl of {"prompt", "attributes"?} / a text file; "" = the demo rows
      train_path="",
      eval_path="",         # held-out rows of the same kind; "" = held-out demo rows
      attributes="labels",  # "labels": each row's own labels; "run": `steer` (and a row's)
      per_iteration=128,    # prompts an iteration answers (epochs over them); 0 = all
      demo_rows=512,
      system=DEFAULT_SYSTEM))
  # n responses per prompt and attribute string (the group), at temperature 1: samples of Q'.
  config.sampling = rounds_sampling_config()
  # log P(y|x): an HF directory or a training run; empty = the starting policy.
  # with_label=True prompts it with the label too (P(y|x) taken as Q'(y|a,x): the weights
  # then reweigh Q's samples by log P(a|x,y) alone), for when no unconditional model exists.
  config.unconditional = ml_collections.ConfigDict(dict(source="", step=-1, with_label=False))
  # P(a_i|x,y) ∝ exp(-(a_i - prediction_i)² / 2σ²) over the labels 0..4.
  config.loss = ml_collections.ConfigDict(dict(attribute_sigma=1.0))
  config.scorer = scorer_section(source="demo_rules")
  config.eval = ml_collections.ConfigDict(dict(
      requests=50,          # held-out requests (their attribute strings) answered greedily
      prompts=10,           # held-out demo prompts of the steering sweep
      attributes="",        # swept attributes; "" = the label's
      scores="0,1,2,3,4",
      max_new_tokens=64,
      batch_size=64))
  config.data = config_base.data_config()
  config.data.update(packing=False, fixed_shape=True)
  config.steer = steer_config()
  config.steer_attributes = ""
  if preset in ("", "demo"):
    return _demo(config)
  if preset == "llama3_70b":
    return _llama3_70b(config)
  raise config_base.unknown_preset("steerlm2", preset, PRESETS)
