"""2D-DPO (and DPO / IPO / 1D baselines) on HelpSteer-2D preference pairs.

  helpsteer-jax --config=configs/dpo2d.py              # demo, CPU, < 3 min
  helpsteer-jax --config=configs/dpo2d.py:llama3_8b \
      --config.init.source=/models/Meta-Llama-3-8B-Instruct \
      --config.data.train_path=/data/helpsteer_2d.jsonl
  helpsteer-jax --config=configs/dpo2d.py:llama3_70b \
      --config.init.source=/runs/acsft_70b   # an AC-SFT run, or an HF directory

Presets: the default (tiny model on the built-in 2D demo pairs), `qwen2_7b`
and `llama3_8b` (the paper's 7-8B scale), `llama3_70b`.
`loss.loss_type`: dpo2d (Eq. 6, or Eq. 5 with loss.grouped=False), dpo, ipo,
dpo1d_segment, dpo1d_aspect.
"""


from helpsteer_jax import config_base
from helpsteer_jax.config_sections import (
  optimizer_config,
  preference_data_config,
  preference_loss_config,
  reference_config,
  train_config,
)

PRESETS = ("demo", "qwen2_7b", "llama3_8b", "llama3_70b")
RUN_KEYS = ("loss.loss_type",)  # default workdir suffix: workdir/dpo2d_ipo
RENAMED = config_base.MODEL_RENAMED

def _base():
  config = config_base.base_config("dpo2d")
  config.data = preference_data_config()
  config.loss = preference_loss_config()
  config.reference = reference_config()
  return config


def _demo(config):
  config.model = config_base.model_section(
      "tiny", hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
      num_kv_heads=2, attention_block_size=64)
  config.loss.beta = 0.5
  config.data.update(demo_train_pairs=320, demo_validation_pairs=32)
  config.reference.batch = 32
  config.train = train_config(num_steps=40, global_batch=16, micro_batch=16, seq_len=128,
                              log_every=10, eval_every=0, save_every=40,
                              export_dtype="float32", loss_chunk_size=64)
  config.optimizer = optimizer_config(lr=1e-3, min_lr=1e-4, warmup_steps=5,
                                      weight_decay=0.0, grad_clip=1.0)
  return config


def _big(config, preset, *, batch=64, lr=5e-7, seq_len=4096, tensor=1):
  # A common DPO recipe at this scale (beta 0.1, lr 5e-7, cosine with warmup, batch 64).
  config.model = config_base.model_section(preset, dtype="bfloat16", param_dtype="float32",
                                          remat_policy="full")
  config.train = train_config(num_steps=1000, global_batch=batch, micro_batch=batch // 8,
                              seq_len=seq_len, log_every=1, eval_every=100, save_every=100,
                              keep_checkpoints=2, loss_chunk_size=512)
  config.optimizer = optimizer_config(lr=lr, min_lr=0.0, warmup_steps=100, weight_decay=0.0,
                                      grad_clip=1.0)
  config.mesh = config_base.mesh_config(data=1, fsdp=-1, tensor=tensor)
  config.data.max_segments = 64
  config.loss.vocab_chunk_size = 4096
  config.require_weights = True
  return config


def get_config(preset: str = ""):
  config = _base()
  if preset in ("", "demo"):
    return _demo(config)
  if preset in ("qwen2_7b", "llama3_8b"):
    return _big(config, preset)
  if preset == "llama3_70b":
    return _big(config, preset, tensor=8)
  raise config_base.unknown_preset("dpo2d", preset, PRESETS)
