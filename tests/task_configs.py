"""Task configs for in-process end-to-end tests: configs/<task>.py with a tiny model and a
few short steps."""

import runpy

import ml_collections

from conftest import REPO_ROOT

TINY_SHAPE = dict(name="tiny", hidden_size=64, intermediate_size=176, num_layers=2,
                  num_heads=4, num_kv_heads=2, attention_block_size=32)


def short_config(task: str, export: bool = False, **sections) -> ml_collections.ConfigDict:
  """configs/<task>.py, tiny and short; `export` keeps the fp32 HF export of training;
  `sections` update config sections (e.g. `scorer={"source": ...}`)."""
  cfg = runpy.run_path(str(REPO_ROOT / "configs" / f"{task}.py"))["get_config"]()
  if "model" in cfg:
    cfg.model.update(TINY_SHAPE)
  if "scorer" in cfg:  # the attribute model's shapes are its source's
    cfg.scorer.model.update(name="tiny", attention_block_size=32)
    cfg.scorer.update(batch_size=8, max_len=128)
  if "train" in cfg:
    cfg.train.update(num_steps=4, global_batch=8, micro_batch=8, seq_len=128, log_every=1,
                     eval_every=0, save_every=100, loss_chunk_size=64)
    cfg.train.update(export_dtype="float32") if export else cfg.train.update(export_hf=False)
    cfg.optimizer.update(warmup_steps=1)
  if "eval_batch_size" in cfg:
    cfg.eval_batch_size = 8
  if "demo_train_rows" in cfg.get("data", {}):
    cfg.data.update(demo_train_rows=48, demo_validation_rows=16)
  for name, values in sections.items():
    cfg[name].update(values)
  return cfg
