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
from helpsteer_jax.data import chat_template, pipeline, template
from helpsteer_jax.data.batches import SFT_BATCH, BatchSchema
from helpsteer_jax.data.features.next_token import sft_features
from helpsteer_jax.data.features.tokenize import FeatureReport
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.formats.task_source import load_conversations
from helpsteer_jax.load import model as loader
from helpsteer_jax.losses.sft import sft_loss
from helpsteer_jax.models import builder
from helpsteer_jax.runs import demo_sources
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib
from helpsteer_jax.train import abstract_step, export, loop
from helpsteer_jax.train import state as state_lib

RESUMES = True  # a rerun resumes the workdir's run (main.py checks its fingerprint)


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
  train_src, val_src = demo_sources.helpsteer_sources(config, workdir)
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


def add_marker_tokens(tokenizer, lora: bool) -> int | None:
  """The first id of the SteerLM markers added to `tokenizer` as single tokens (None:
  none added), so that the model learns to end its turn with one id.

  A LoRA run keeps the embeddings frozen and could not learn new rows: its
  markers stay split, and engines need the turn marker as a stop string.
  """
  split = chat_template.split_markers(tokenizer)
  if not split:
    return None
  if lora:
    logging.warning("the tokenizer splits the SteerLM markers %s into several tokens and a"
                    " LoRA run cannot train new embedding rows: the export will not stop at"
                    " the end of its turn unless %r is given as a stop string", split,
                    template.TURN_START)
    return None
  first = len(tokenizer)
  chat_template.add_marker_tokens(tokenizer)
  logging.info("added the SteerLM markers %s to the tokenizer as ids %d..%d", split, first,
               len(tokenizer) - 1)
  return first


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  setup = setup_lib.prepare(config, workdir)
  first_added = add_marker_tokens(setup.tokenizer, setup.model_cfg.lora is not None)
  train_features, eval_features, train_report, bad_records, steer = load_data(
      config, setup.workdir, setup.tokenizer)
  seq_len = config.train.seq_len
  fill = pipeline.packing_efficiency(train_features, seq_len, config.data.packing)
  logging.info("train data: %s; packing efficiency %.1f%%", train_report.summary(), 100 * fill)

  model = loader.load_model(config, setup.rt, loader.TRAIN)
  if first_added is not None:
    model = builder.add_token_rows(model, first_added, len(setup.tokenizer), setup.rt.mesh,
                                   setup.rt.rules, seed=config.seed)
  model_cfg = model.cfg
  parts = state_lib.split_model(model, setup.rt.mesh, setup.rt.rules)
  del model
  # The export writes the augmented tokenizer itself; otherwise the files are copied.
  tokenizer_files = setup.tokenizer if first_added is not None else setup.tokenizer_dir
  trainer = loop.Trainer(
      config, setup.workdir, setup.rt, parts, loss_fn(config), train_features, eval_features,
      flops_per_token=model_cfg.flops_per_token(seq_len),
      export_fn=export.hf_exporter(setup.workdir, tokenizer_files, setup.tokenizer,
                                     parts, config, steer))
  result = trainer.run()
  trainer.close()
  summary = summary_lib.training_summary(result, data={
      "train": train_report.as_dict(), "packing_efficiency": fill,
      "bad_records": bad_records.counts})
  summary_lib.write_summary(
      setup.workdir / "summary.json", summary,
      f"{summary_lib.result_line(config, result)}{summary_lib.metrics_text(result.eval_metrics)}",
      f"data: {train_report.summary()}; packing efficiency {100 * fill:.1f}%;"
      f" {bad_records.summary()}", outputs=summary_lib.run_outputs(setup.workdir))
  return summary
