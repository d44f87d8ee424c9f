"""Attribute Prediction Model (SteerLM step 1) and Bradley-Terry reward models.

  helpsteer-jax --config=configs/attribute_model.py        # demo, CPU, < 3 min
  helpsteer-jax --config=configs/attribute_model.py:llama3_70b_helpsteer2 \
      --config.init.source=/models/Meta-Llama-3-70B \
      --config.data.train_path=/data/HelpSteer2 --config.data.validation_path=/data/HelpSteer2
  helpsteer-jax --config=configs/attribute_model.py:llama3_1_70b_scaled_bt \
      --config.init.source=workdir/attribute_model --config.tokenizer=/models/Llama-3.1-70B \
      --config.data.train_path=/data/HelpSteer2 --config.data.validation_path=/data/HelpSteer2

`loss` is `regression` (masked MSE on the nine attributes) or one of the
Bradley-Terry variants `regular_bt`, `margin_bt`, `scaled_bt` on
HelpSteer2-Preference pairs (reward = the `bt_attribute` slot). The trained model is
also written as an HF *ForSequenceClassification directory, `<workdir>/hf`.
Presets: the default (tiny model on the built-in demo data), `llama3_70b_helpsteer2`,
`llama2_13b_helpsteer`, `llama3_1_70b_scaled_bt`, `demo_scaled_bt` (scaled BT on the demo
pairs from the default run's workdir, written to workdir/attribute_model_bt).
"""

from helpsteer_jax import config_base
from helpsteer_jax.config_sections import init_config, optimizer_config, train_config

PRESETS = ("demo", "llama3_70b_helpsteer2", "llama2_13b_helpsteer", "llama3_1_70b_scaled_bt",
           "demo_scaled_bt")
RUN_KEYS = ("loss",)  # default workdir suffix: workdir/attribute_model_scaled_bt
RENAMED = {**config_base.MODEL_RENAMED, "score.batch_size": "eval_batch_size",
           "score": "removed: the final evaluation scores train.seq_len-token inputs in"
                    " batches of eval_batch_size"}


def _demo(config):
  # The AC-SFT demo's model shape, so `init.source` may point at its workdir.
  config.model = config_base.model_section(
      "tiny", hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
      num_kv_heads=2)
  config.train = train_config(num_steps=200, global_batch=16, micro_batch=16, seq_len=256,
                              log_every=25, eval_every=100, save_every=100)
  config.optimizer = optimizer_config(lr=2e-3, min_lr=1e-4, warmup_steps=20,
                                      weight_decay=0.01, grad_clip=1.0)
  return config


def _big(config, preset, *, steps, batch, lr, min_lr=0.0, schedule="cosine", warmup=10,
         constant_steps=0):
  config.model = config_base.model_section(preset, dtype="bfloat16", param_dtype="float32",
                                          remat_policy="full")
  config.train = train_config(num_steps=steps, global_batch=batch, micro_batch=batch,
                              seq_len=4096, log_every=1, eval_every=50, save_every=50,
                              keep_checkpoints=2)
  config.eval_batch_size = 8
  config.optimizer = optimizer_config(lr=lr, min_lr=min_lr, schedule=schedule,
                                      warmup_steps=warmup, constant_steps=constant_steps,
                                      weight_decay=0.01, grad_clip=1.0)
  config.mesh = config_base.mesh_config(data=1, fsdp=-1, tensor=1)
  config.require_weights = True
  return config


def get_config(preset: str = ""):
  config = config_base.base_config("attribute_model")
  config.loss = "regression"      # or regular_bt | margin_bt | scaled_bt
  config.bt_attribute = "helpfulness"  # the head slot Bradley-Terry trains (and reads)
  # A head bias has no place in transformers' *ForSequenceClassification (the HF export
  # at the end of training refuses it); True needs --config.train.export_hf=False.
  config.head_bias = False
  config.eval_batch_size = 16  # rows per batch of the final evaluation's scoring
  # format: regression's rows (auto | helpsteer | steerlm | tfds); the BT losses'
  # pairs: auto (HelpSteer2-Preference) or helpsteer3 (its preference config, where
  # domains / languages keep the listed ones, comma-separated; "" = all).
  config.data = config_base.data_config(domains="", languages="")
  config.init = init_config()
  if preset in ("", "demo"):
    return _demo(config)
  if preset == "demo_scaled_bt":
    # HelpSteer2-Preference's recipe on the demo data: Scaled Bradley-Terry starting from the
    # demo regression run's backbone and head (its helpfulness slot is the reward).
    config = _demo(config)
    config.loss = "scaled_bt"
    config.data.packing = False  # a pair is one row (two segments)
    config.init.source = "workdir/attribute_model"
    config.require_init_checkpoint = True
    config.workdir = "workdir/attribute_model_bt"
    config.train.update(num_steps=100, seq_len=512, eval_every=50, save_every=50)
    config.optimizer.update(lr=5e-4, min_lr=5e-4, schedule="constant", warmup_steps=10)
    return config
  if preset == "llama3_70b_helpsteer2":
    # HelpSteer2 paper (NeMo-Aligner): 2 epochs of HelpSteer2 = 317 steps at global batch
    # 128, constant lr 2e-6 after 10 warmup steps, sequence length 4096.
    return _big(config, "llama3_70b", steps=317, batch=128, lr=2e-6, schedule="constant")
  if preset == "llama2_13b_helpsteer":
    # SteerLM on HelpSteer (v1): 800 steps at global batch 512, lr 9e-6 cosine -> 9e-7.
    return _big(config, "llama2_13b", steps=800, batch=512, lr=9e-6, min_lr=9e-7)
  if preset == "llama3_1_70b_scaled_bt":
    # HelpSteer2-Preference: Scaled Bradley-Terry from the regression model's head,
    # lr 1e-6 (constant, 10 warmup steps), 105 steps at global batch 128.
    config = _big(config, "llama3_1_70b", steps=105, batch=128, lr=1e-6, schedule="constant")
    config.loss = "scaled_bt"
    config.data.packing = False  # a pair is one row (two segments)
    config.train.seq_len = 8192  # 4096 per response
    config.require_weights = False
    config.require_init_checkpoint = True
    return config
  raise config_base.unknown_preset("attribute_model", preset, PRESETS)
