"""Preference optimisation on pairs: the run behind 2D-DPO and its baselines (DPO,
IPO, 1D segment / aspect), and each round of iterative DPO.

Reads HelpSteer-2D JSONL or CSV, or prompt/chosen/rejected rows (the built-in 2D
demo pairs by default), tokenizes each pair into a chosen and a rejected row with
per-token segment ids, gets the reference log-probs (a cached first pass, or on the
fly in the step), and trains the policy with the shared loop. The policy starts from
`init.source` (an HF directory or an AC-SFT run) or a fresh `model.name`. The HF
export's chat template steers `data.response_label`'s attributes (its scores the
defaults) when the pairs were trained under a label, else those of the policy's
source export.
"""

from __future__ import annotations

import functools
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from helpsteer_jax import runtime
from helpsteer_jax.config_reads import Reads
from helpsteer_jax.data import chat_template
from helpsteer_jax.data.batches import CACHED_PAIR_BATCH, PAIR_BATCH, BatchSchema
from helpsteer_jax.data.features import pair_rows
from helpsteer_jax.data.formats import helpsteer_2d
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.losses import dpo2d
from helpsteer_jax.losses.pair_logprobs import preference_loss
from helpsteer_jax.models import builder
from helpsteer_jax.runs import policy, setup_2d
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib
from helpsteer_jax.train import abstract_step, export, loop, reference

REFERENCE_MODES = ("cached", "on_the_fly")


def loss_config(config: ml_collections.ConfigDict, csv: bool) -> dpo2d.PreferenceLossConfig:
  """The loss settings, checked before anything compiles."""
  lc = config.loss
  aspects, weights = tuple(lc.aspects), tuple(float(w) for w in lc.aspect_weights)
  if csv:  # one aggregated score per segment
    aspects, weights = helpsteer_2d.CSV_ASPECTS, (1.0,)
  problems = []
  if lc.loss_type not in dpo2d.LOSS_TYPES:
    problems.append(f"loss.loss_type={lc.loss_type!r}: choose one of {dpo2d.LOSS_TYPES}")
  if not lc.beta > 0:
    problems.append(f"loss.beta={lc.beta} must be > 0")
  if not 0 <= lc.label_smoothing < 0.5:
    problems.append(f"loss.label_smoothing={lc.label_smoothing} must be in [0, 0.5)")
  if len(weights) != len(aspects):
    problems.append(f"loss.aspect_weights has {len(weights)} entries for"
                    f" {len(aspects)} loss.aspects {aspects}")
  elif not math.isclose(sum(weights), 1.0, abs_tol=1e-6) or min(weights) < 0:
    problems.append(f"loss.aspect_weights={weights} must be >= 0 and sum to 1")
  if config.reference.mode not in REFERENCE_MODES:
    problems.append(f"reference.mode={config.reference.mode!r}: choose one of {REFERENCE_MODES}")
  if config.data.score_max <= 0:
    problems.append(f"data.score_max={config.data.score_max} must be > 0")
  if problems:
    raise ConfigError("; ".join(problems))
  return dpo2d.PreferenceLossConfig(
      loss_type=lc.loss_type, beta=float(lc.beta), grouped=bool(lc.grouped),
      label_smoothing=float(lc.label_smoothing), aspect_weights=weights, aspects=aspects)


def config_reads() -> list[Reads]:
  """The pair-training keys only some runs read (`config_reads`): a loss type's own
  options and the cached reference pass's."""
  return [
      Reads(("loss.label_smoothing",), "loss.loss_type", "dpo",
            lambda c: c.loss.loss_type == "dpo"),
      Reads(("loss.grouped",), "loss.loss_type", "dpo2d or dpo1d_segment",
            lambda c: c.loss.loss_type in ("dpo2d", "dpo1d_segment")),
      Reads(("reference.cache_dir", "reference.batch"), "reference.mode", "cached",
            lambda c: c.reference.mode == "cached", harmless=True),
  ]


def data_sources(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> tuple[str, str]:
  """(train, validation) 2D pair files; the 2D demo pairs when none is configured."""
  data = config.data
  if data.train_path:
    return data.train_path, data.validation_path
  return setup_2d.demo_2d_files(workdir, data.demo_train_pairs, data.demo_validation_pairs)


def load_features(path: str, config, cfg: dpo2d.PreferenceLossConfig, tokenizer) -> list:
  data = config.data
  report = BadRecordReport()
  rows = helpsteer_2d.read_2d(path, cfg.aspects, data.score_max, data.on_bad_record, report,
                              whole_responses=cfg.loss_type in dpo2d.SEQUENCE_LOSSES)
  if report.total:
    logging.warning("%s: %s", path, report.summary())
  features, tok_report = pair_rows.pair_features(
      rows, tokenizer, config.train.seq_len, data.max_segments, data.score_max,
      data.truncation, data.add_bos, data.response_label or None)
  logging.info("%s: %s", path, tok_report.summary())
  return features


def steer_spec(config: ml_collections.ConfigDict) -> chat_template.SteerSpec:
  """The export's steerable attributes: the response label's, else the policy source's
  (`policy.source_spec`)."""
  if config.data.response_label:
    try:
      return chat_template.SteerSpec.from_label(config.data.response_label)
    except ValueError as e:
      raise ConfigError(f"data.response_label: {e}") from None
  return policy.source_spec(config)


def _model_source(config) -> str:
  m, init = config.model, config.init
  return json.dumps({"source": init.source,
                     "init_step": init.step, "model": m.name, "seed": config.seed,
                     "dtype": m.dtype,
                     "lora_adapter": m.lora.adapter, "lora_base_dtype": m.lora.base_dtype})


def _with_reference(features, ref):
  return [dict(f, ref_logps=r) for f, r in zip(features, ref)]


def adapters_off_reference(config: ml_collections.ConfigDict, fresh: bool = True) -> bool:
  """On the fly with fresh LoRA adapters (`fresh`: none restored from an AC-SFT run),
  the reference is the model with them off: the base, which they start equal to."""
  lc = config.model.lora
  return (config.reference.mode == "on_the_fly" and bool(lc.rank) and not lc.adapter
          and fresh)


def batch_schema(config: ml_collections.ConfigDict) -> tuple[BatchSchema, dict[str, int]]:
  """The step's batch: pairs, with the cached reference log-probs unless it runs on the fly."""
  cached = config.reference.mode != "on_the_fly"
  return (CACHED_PAIR_BATCH if cached else PAIR_BATCH), {
      "length": config.train.seq_len, "segments": config.data.max_segments,
      "aspects": len(loss_config(config, csv=False).aspects)}


def abstract_train_step(config: ml_collections.ConfigDict,
                        rt: runtime.Runtime) -> abstract_step.StepSpec:
  """The preference step on abstract weights and batches (compile-only runs).

  With `reference.mode=cached` the batch carries the reference log-probs;
  on the fly, the step also takes the frozen reference parameters.
  """
  cfg = loss_config(config, csv=False)
  model_cfg = runtime.model_config(config, weights=False)
  n = config.train.seq_len
  schema, dims = batch_schema(config)
  on_the_fly = config.reference.mode == "on_the_fly"
  adapters_off = adapters_off_reference(config)
  per_token = model_cfg.flops_per_token(n)
  if on_the_fly:  # plus the reference's forward: a third of a training pass
    per_token *= 4 / 3
  loss = functools.partial(preference_loss, cfg=cfg, chunk_size=config.train.loss_chunk_size,
                           vocab_chunk=config.loss.vocab_chunk_size,
                           adapters_off_reference=adapters_off)
  return abstract_step.trainer_step_spec(
      config, rt, lambda: builder.new_model(model_cfg), loss,
      schema.row_fields(**dims), per_token, tokens_per_row=2 * n,
      frozen_params=on_the_fly and not adapters_off)


def train(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Preference optimisation of the configured policy on the configured pairs (see the
  module doc); the summary, also written to `summary.json`."""
  train_src, val_src = data_sources(config, pathlib.Path(workdir))
  cfg = loss_config(config, csv=train_src.endswith(".csv"))
  steer = steer_spec(config)
  setup = setup_lib.prepare(config, workdir)
  rt, workdir = setup.rt, setup.workdir
  train_features = load_features(train_src, config, cfg, setup.tokenizer)
  eval_features = load_features(val_src, config, cfg, setup.tokenizer) if val_src else []
  if not train_features:
    raise ConfigError(f"no usable training pairs in {train_src} (see the log for why)")

  parts, fresh_adapters = policy.load_policy(config, rt)
  adapters_off = adapters_off_reference(config, fresh_adapters)

  chunk, vocab_chunk = config.train.loss_chunk_size, config.loss.vocab_chunk_size
  frozen = None
  if config.reference.mode == "cached":
    cache = config.reference.cache_dir or str(workdir / "reference")
    rows = config.reference.batch or config.train.micro_batch
    source = _model_source(config)
    train_features = _with_reference(train_features, reference.reference_logps(
        parts, train_features, rt, rows, pathlib.Path(cache) / "train", source, chunk,
        vocab_chunk))
    if eval_features:
      eval_features = _with_reference(eval_features, reference.reference_logps(
          parts, eval_features, rt, rows, pathlib.Path(cache) / "validation", source, chunk,
          vocab_chunk))
  elif adapters_off:  # the base model: the policy with its adapters off
    pass
  else:  # the reference stays in memory: a copy of the initial policy (or initial adapters)
    with jax.set_mesh(rt.mesh):
      ref = jax.jit(lambda p: jax.tree.map(jnp.copy, p),
                    out_shardings=parts.param_shardings)(parts.params)
    frozen = (ref, parts.param_shardings)

  trainer = loop.Trainer(
      config, workdir, rt, parts, functools.partial(
          preference_loss, cfg=cfg, chunk_size=chunk, vocab_chunk=vocab_chunk,
          adapters_off_reference=adapters_off),
      train_features, eval_features,
      flops_per_token=setup.model_cfg.flops_per_token(config.train.seq_len),
      export_fn=export.hf_exporter(setup.workdir, setup.tokenizer_dir, setup.tokenizer,
                                     parts, config, steer, "trained policy"),
      frozen=frozen)
  result = trainer.run()
  trainer.close()
  summary = summary_lib.training_summary(
      result, loss_type=cfg.loss_type,
      pairs={"train": len(train_features), "validation": len(eval_features)})
  accuracy = result.last_metrics.get("reward_accuracy", float("nan"))
  summary_lib.write_summary(
      workdir / "summary.json", summary,
      f"{summary_lib.result_line(config, result, loss=f'{cfg.loss_type} loss')}; reward accuracy"
      f" {accuracy:.3f}{summary_lib.metrics_text(result.eval_metrics)}",
      outputs=summary_lib.run_outputs(workdir))
  return summary
