"""Attribute-Conditioned SFT (SteerLM step 3).

Reads HelpSteer / HelpSteer2 rows or NeMo SteerLM conversations (the demo
data by default), renders them with the SteerLM template (assistant turns
carry their attribute string), tokenizes with NeMo's loss mask, packs, and
trains with the shared loop. Ends with a checkpoint and an HF export whose
chat template steers the attributes the training labels carry.
"""

from __future__ import annotations

import functools
import pathlib

import ml_collections
from absl import logging

from helpsteer_jax import runtime
from helpsteer_jax.data import chat_template, pipeline
from helpsteer_jax.data.batches import SFT_BATCH, BatchSchema
from helpsteer_jax.data.features.next_token import sft_features
from helpsteer_jax.data.features.tokenize import FeatureReport
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.formats.task_source import load_conversations
from helpsteer_jax.losses.sft import sft_loss
from helpsteer_jax.models import builder
from helpsteer_jax.tasks import setup as setup_lib
from helpsteer_jax.tasks import summary as summary_lib
from helpsteer_jax.train import abstract_step, export, loop
from helpsteer_jax.train import state as state_lib


def loss_fn(config: ml_collections.ConfigDict) -> loop.LossFn:
  return functools.partial(sft_loss, chunk_size=config.train.loss_chunk_size)


def batch_schema(config: ml_collections.ConfigDict) -> tuple[BatchSchema, dict[str, int]]:
  """The step's batch: its schema and axis sizes."""
  return SFT_BATCH, {"length": config.train.seq_len}


def abstract_train_step(config: ml_collections.ConfigDict,
                        rt: runtime.Runtime) -> abstract_step.StepSpec:
  """The AC-SFT step on abstract weights and batches (compile-only runs)."""
  model_cfg = runtime.model_config(config, weights=False)
  schema, dims = batch_schema(config)
  return abstract_step.trainer_step_spec(
      config, rt, lambda: builder.new_model(model_cfg), loss_fn(config),
      schema.row_fields(**dims), model_cfg.flops_per_token(config.train.seq_len))


def load_data(config: ml_collections.ConfigDict, workdir: pathlib.Path, tokenizer
              ) -> tuple[list, list, FeatureReport, BadRecordReport, chat_template.SteerSpec]:
  """(train examples, validation examples, the train report, bad records, the
  attributes the training labels carry)."""
  train_src, val_src = setup_lib.helpsteer_sources(config, workdir)
  make = functools.partial(sft_features, tokenizer=tokenizer, seq_len=config.train.seq_len,
                           truncation=config.data.truncation, add_bos=config.data.add_bos)
  bad_records = BadRecordReport()
  train_conversations = load_conversations(train_src, "train", config, bad_records)
  steer = chat_template.trained_attributes(train_conversations)
  train_features, train_report = make(train_conversations)
  eval_features = []
  if val_src:
    eval_features, val_report = make(load_conversations(val_src, config.data.validation_split,
                                                        config, bad_records))
    logging.info("validation data: %s", val_report.summary())
  return train_features, eval_features, train_report, bad_records, steer


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  setup = setup_lib.prepare(config, workdir)
  train_features, eval_features, train_report, bad_records, steer = load_data(
      config, setup.workdir, setup.tokenizer)
  seq_len = config.train.seq_len
  fill = pipeline.packing_efficiency(train_features, seq_len, config.data.packing)
  logging.info("train data: %s; packing efficiency %.1f%%", train_report.summary(), 100 * fill)

  model = runtime.build_model(config, setup.rt)
  parts = state_lib.split_model(model, setup.rt.mesh, setup.rt.rules)
  del model
  trainer = loop.Trainer(
      config, setup.workdir, setup.rt, parts, loss_fn(config), train_features, eval_features,
      flops_per_token=setup.model_cfg.flops_per_token(seq_len),
      export_fn=export.hf_exporter(setup.workdir, setup.tokenizer_dir, setup.tokenizer,
                                     parts, config, steer))
  result = trainer.run()
  trainer.close()
  summary = summary_lib.training_summary(result, data={
      "train": train_report.as_dict(), "packing_efficiency": fill,
      "bad_records": bad_records.counts})
  summary_lib.write_summary(
      setup.workdir / "summary.json", summary,
      f"{summary_lib.result_line(config, result)}; eval {result.eval_metrics}",
      f"data: {train_report.summary()}; packing efficiency {100 * fill:.1f}%;"
      f" {bad_records.summary()}")
  return summary
