"""Iterative DPO with the attribute model as the judge (HelpSteer2 paper), rounds in one run.

  # the default AC-SFT run's policy, the demo prompts, the demo rules as the reward
  helpsteer-jax --config=configs/acsft.py && helpsteer-jax --config=configs/iterative_dpo.py
  # Llama 3 70B, HelpSteer2's prompts, a trained attribute model
  helpsteer-jax --config=configs/iterative_dpo.py:llama3_70b \\
      --config.init.source=/models/Llama-3-70B-SteerLM-HF \\
      --config.prompts.train_path=/data/helpsteer2/train.jsonl.gz \\
      --config.scorer.source=/runs/attribute_model_70b

Each iteration samples `sampling.responses` answers per prompt (temperature 0.7,
top-p 0.9), pairs the best against the worst by `scorer.weights` · predictions
(ties dropped) and trains `train.num_steps` DPO steps (`loss`, `reference`: the
dpo2d task's sequence-level losses) from the last iteration's weights.
`iterations` counts rounds.

Presets: the default (the demo AC-SFT run's tiny policy), `llama3_70b`.
"""

import ml_collections

from helpsteer_jax import config_base
from helpsteer_jax.config_sections import (
  DEFAULT_SYSTEM,
  demo_policy,
  optimizer_config,
  preference_data_config,
  preference_loss_config,
  reference_config,
  rounds_sampling_config,
  scorer_on_mesh,
  scorer_section,
  steer_config,
  train_config,
)

PRESETS = ("demo", "llama3_70b")
RUN_KEYS = ("loss.loss_type",)  # default workdir suffix: workdir/iterative_dpo_dpo
RENAMED = config_base.MODEL_RENAMED


def _demo(config):
  demo_policy(config, num_steps=20, global_batch=16, micro_batch=16, log_every=5,
              eval_every=0, save_every=20)
  config.loss.beta = 0.5
  config.reference.batch = 32
  config.optimizer = optimizer_config(lr=5e-4, min_lr=5e-5, warmup_steps=2,
                                      weight_decay=0.0, grad_clip=1.0)
  return config


def _llama3_70b(config):
  # A common DPO recipe at this scale (beta 0.1, lr 5e-7 cosine with warmup), per round.
  config.model = config_base.model_section("llama3_70b", dtype="bfloat16",
                                          param_dtype="float32", remat_policy="full")
  config.train = train_config(num_steps=200, global_batch=64, micro_batch=8, seq_len=4096,
                              log_every=1, eval_every=0, save_every=50, keep_checkpoints=2,
                              loss_chunk_size=512)
  config.optimizer = optimizer_config(lr=5e-7, min_lr=0.0, warmup_steps=20, weight_decay=0.0,
                                      grad_clip=1.0)
  config.loss.vocab_chunk_size = 4096
  config.sampling.update(responses=8, max_new_tokens=1024, batch_prompts=64)
  config.prompts.update(per_iteration=0, eval_limit=50)
  config.mesh = config_base.mesh_config(data=1, fsdp=-1, tensor=8)
  scorer_on_mesh(config, "llama3_70b")
  config.require_weights = True
  return config


def get_config(preset: str = ""):
  config = config_base.base_config("iterative_dpo")
  config.iterations = 2
  config.prompts = ml_collections.ConfigDict(dict(
      train_path="",      # .jsonl ({"prompt"}; HelpSteer2 rows), text; "" = demo prompts
      eval_path="",       # prompts whose greedy answers are scored; "" = 50 held-out demo ones
      system=DEFAULT_SYSTEM,
      eval_limit=50,
      demo_train_prompts=512,
      per_iteration=128))  # prompts a round answers (epochs over them); 0 = all
  config.sampling = rounds_sampling_config(temperature=0.7, top_p=0.9)  # the paper's
  config.scorer = scorer_section(source="demo_rules")
  config.loss = preference_loss_config(loss_type="dpo")
  config.reference = reference_config()
  config.data = preference_data_config()
  config.steer = steer_config()
  config.steer_attributes = ""
  if preset in ("", "demo"):
    return _demo(config)
  if preset == "llama3_70b":
    return _llama3_70b(config)
  raise config_base.unknown_preset("iterative_dpo", preset, PRESETS)
