"""Attribute-Conditioned SFT (SteerLM step 3).

  helpsteer-jax --config=configs/acsft.py              # demo, CPU, ~3 min
  helpsteer-jax --config=configs/acsft.py:llama2_70b \
      --config.init.source=/models/Llama-2-70b-hf \
      --config.data.train_path=/data/steerlm_train.jsonl \
      --config.data.validation_path=/data/steerlm_val.jsonl

Presets: the default (tiny model on the built-in demo data), `llama2_70b`
(the NeMo-Aligner SteerLM tutorial recipe), `llama3_70b`, `llama3_8b`, and
`smollm2_135m` (a real small model from a local HF directory).
"""

from helpsteer_jax import config_base
from helpsteer_jax.config_sections import optimizer_config, train_config

PRESETS = ("demo", "llama2_70b", "llama3_70b", "llama3_8b", "smollm2_135m")
RENAMED = config_base.MODEL_RENAMED


def _demo(config):
  config.model = config_base.model_section(
      "tiny", hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
      num_kv_heads=2)
  config.train = train_config(num_steps=200, global_batch=16, micro_batch=16, seq_len=256,
                              log_every=25, eval_every=100, save_every=100,
                              export_dtype="float32", loss_chunk_size=128)
  config.optimizer = optimizer_config(lr=3e-3, min_lr=3e-4, warmup_steps=20,
                                      weight_decay=0.01, grad_clip=1.0)
  return config


def _big(config, preset, *, steps, batch, lr, min_lr, constant_steps, warmup):
  config.model = config_base.model_section(preset, dtype="bfloat16", param_dtype="float32",
                                          remat_policy="full")
  config.train = train_config(num_steps=steps, global_batch=batch, micro_batch=batch,
                              seq_len=4096, log_every=1, eval_every=100, save_every=50,
                              keep_checkpoints=2, loss_chunk_size=512)
  config.optimizer = optimizer_config(lr=lr, min_lr=min_lr, constant_steps=constant_steps,
                                      warmup_steps=warmup, weight_decay=0.01, grad_clip=1.0)
  config.mesh = config_base.mesh_config(data=1, fsdp=-1, tensor=1)
  config.require_weights = True
  return config


def get_config(preset: str = ""):
  config = config_base.base_config("acsft")
  config.data = config_base.data_config()
  if preset in ("", "demo"):
    return _demo(config)
  if preset == "llama2_70b":
    # NeMo-Aligner SteerLM tutorial: 800 steps, global batch 128, lr 6e-6 -> 5e-6
    # (CosineAnnealing with 200 constant steps), weight decay 0.01, length 4096.
    return _big(config, "llama2_70b", steps=800, batch=128, lr=6e-6, min_lr=5e-6,
                constant_steps=200, warmup=1)
  if preset in ("llama3_70b", "llama3_8b"):
    # The same recipe on Llama 3 (e.g. HelpSteer2 + annotated conversations).
    return _big(config, preset, steps=800, batch=128, lr=6e-6, min_lr=5e-6,
                constant_steps=200, warmup=1)
  if preset == "smollm2_135m":
    config.model = config_base.model_section("smollm2_135m", attention_impl="blockwise")
    config.train = train_config(num_steps=1000, global_batch=32, micro_batch=8, seq_len=2048,
                                log_every=10, eval_every=200, save_every=200,
                                loss_chunk_size=512, export_dtype="bfloat16")
    config.optimizer = optimizer_config(lr=2e-5, min_lr=2e-6, warmup_steps=50)
    config.require_weights = True
    return config
  raise config_base.unknown_preset("acsft", preset, PRESETS)
