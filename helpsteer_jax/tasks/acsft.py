"""Attribute-Conditioned SFT (SteerLM step 3).

Reads HelpSteer / HelpSteer2 rows or NeMo SteerLM conversations (the demo
data by default), renders them with the SteerLM template (assistant turns
carry their attribute string), tokenizes with NeMo's loss mask, packs, and
trains with the shared loop. Ends with a checkpoint and an HF export.
"""

from __future__ import annotations

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from helpsteer_jax import runtime
from helpsteer_jax.data import demo, pipeline, readers
from helpsteer_jax.data.sources import load_conversations
from helpsteer_jax.data.sft import sft_features
from helpsteer_jax.losses.sft import sft_loss
from helpsteer_jax.models import builder, hf
from helpsteer_jax.train import abstract_step, loop
from helpsteer_jax.train import state as state_lib


def resolve_data_paths(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> tuple[str, str]:
  """(train, validation) sources; the demo dataset when none is configured."""
  data = config.data
  if not data.train_path:
    demo_dir = runtime.write_once(workdir / "demo_data", "validation.jsonl.gz", lambda d: (
        demo.write_demo_dataset(d, data.demo_train_rows, data.demo_validation_rows)))
    return str(demo_dir), str(demo_dir)
  return data.train_path, data.validation_path


def loss_fn(config: ml_collections.ConfigDict) -> loop.LossFn:
  return functools.partial(sft_loss, chunk_size=config.train.loss_chunk_size)


def abstract_train_step(config: ml_collections.ConfigDict,
                        rt: runtime.Runtime) -> abstract_step.StepSpec:
  """The AC-SFT step on abstract weights and batches (compile-only runs)."""
  model_cfg = runtime.model_config(config, weights=False)
  seq_len = config.train.seq_len
  fields = {k: ((seq_len,), jnp.int32) for k in pipeline.BATCH_KEYS}
  fields["weights"] = ((seq_len,), jnp.float32)
  return abstract_step.trainer_step_spec(
      config, rt, lambda: builder.new_model(model_cfg), loss_fn(config), fields,
      model_cfg.flops_per_token(seq_len))


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  workdir = pathlib.Path(workdir)
  rt = runtime.setup(config)
  runtime.check_workdir(workdir)
  tok_dir = runtime.tokenizer_dir(config, workdir)
  tokenizer = hf.load_tokenizer(tok_dir)
  model_cfg = runtime.model_config(config)
  runtime.check_tokenizer_fits(tokenizer, model_cfg.vocab_size)

  train_src, val_src = resolve_data_paths(config, workdir)
  seq_len = config.train.seq_len
  make = functools.partial(sft_features, tokenizer=tokenizer, seq_len=seq_len,
                           truncation=config.data.truncation, add_bos=config.data.add_bos)
  bad_records = readers.BadRecordReport()
  train_features, train_report = make(load_conversations(train_src, "train", config, bad_records))
  fill = pipeline.packing_efficiency(train_features, seq_len, config.data.packing)
  logging.info("train data: %s; packing efficiency %.1f%%", train_report.summary(), 100 * fill)
  eval_features = []
  if val_src:
    eval_features, val_report = make(load_conversations(val_src, config.data.validation_split, config,
                                                           bad_records))
    logging.info("validation data: %s", val_report.summary())

  model = runtime.build_model(config, rt)
  parts = state_lib.split_model(model, rt.mesh, rt.rules)
  del model

  def export(params):
    out = workdir / "hf"
    hf.save_hf_model(state_lib.merge_model(parts, params), out,
                     dtype=config.train.export_dtype, tokenizer=tok_dir)
    logging.info("exported the trained model to %s", out)

  trainer = loop.Trainer(
      config, workdir, rt, parts, loss_fn(config), train_features, eval_features,
      flops_per_token=model_cfg.flops_per_token(seq_len), export_fn=export)
  result = trainer.run()
  trainer.close()
  summary = {"status": result.status, "step": result.step, "train": result.last_metrics,
             "eval": result.eval_metrics,
             "data": {"train": vars(train_report), "packing_efficiency": fill,
                      "bad_records": bad_records.counts}}
  if jax.process_index() != 0:
    return summary
  (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  print(f"{config.task}: {result.status} at step {result.step};"
        f" loss {result.last_metrics.get('loss', float('nan')):.4f};"
        f" eval {result.eval_metrics}")
  print(f"data: {train_report.summary()}; packing efficiency {100 * fill:.1f}%;"
        f" {bad_records.summary()}")
  return summary
