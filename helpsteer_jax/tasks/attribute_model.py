"""Attribute Prediction Model (SteerLM step 1) and Bradley-Terry reward models.

`loss=regression`: HelpSteer / HelpSteer2 rows (or labelled SteerLM
conversations; the demo data by default) in NeMo's regression format, masked
MSE on the nine attribute slots. `loss=regular_bt|margin_bt|scaled_bt`:
HelpSteer2-Preference pairs, or HelpSteer3's preference config with
`data.format=helpsteer3` (ties dropped; strength |preference|), reward = the
`bt_attribute` slot. Trains with the shared loop, then scores the validation set and
writes `head.npz`, `summary.json` and the metrics table, and (`train.export_hf`)
the model as an HF *ForSequenceClassification directory in `<workdir>/hf`.
"""

from __future__ import annotations

import functools
import pathlib

import ml_collections
from absl import logging

from helpsteer_jax import choices, processes, runtime, weights
from helpsteer_jax.data.batches import BT_BATCH, REGRESSION_BATCH, BatchSchema
from helpsteer_jax.data.features import regression_ids as rid
from helpsteer_jax.data.features import rm as rm_data
from helpsteer_jax.data.formats import helpsteer3, preference
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.formats.task_source import load_conversations
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.load import model as loader
from helpsteer_jax.load import reward as reward_model
from helpsteer_jax.losses.bt import BT_VARIANTS, bt_loss
from helpsteer_jax.losses.regression import regression_loss
from helpsteer_jax.models import reward, reward_hf
from helpsteer_jax.runs import demo_sources
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib
from helpsteer_jax.scoring import evaluate as rm_eval
from helpsteer_jax.scoring import report as rm_report
from helpsteer_jax.scoring.model import ModelScorer
from helpsteer_jax.train import abstract_step, export, loop
from helpsteer_jax.train import state as state_lib

RESUMES = True  # a rerun resumes the workdir's run (main.py checks its fingerprint)

LOSSES = choices.ATTRIBUTE_LOSSES
PAIR_FORMATS = ("auto", "helpsteer3")  # auto: HelpSteer2-Preference


def check_config(config: ml_collections.ConfigDict) -> None:
  """Fails before any work on settings that cannot run."""
  if config.loss not in LOSSES:
    raise ConfigError(f"loss={config.loss!r}; choose one of {', '.join(LOSSES)}")
  if config.bt_attribute not in ATTRIBUTES:
    raise ConfigError(f"bt_attribute={config.bt_attribute!r}; choose one of {ATTRIBUTES}")
  if config.head_bias and config.train.export_hf:
    raise ConfigError(f"head_bias=True: {reward_hf.BIAS_REFUSED}")
  if config.loss in BT_VARIANTS and config.data.format not in PAIR_FORMATS:
    raise ConfigError(f"data.format={config.data.format!r} with loss={config.loss}: the"
                      " Bradley-Terry losses read HelpSteer2-Preference pairs (auto) or"
                      " HelpSteer3's preference config (helpsteer3)")
  if config.loss == "regression" and config.data.format == "helpsteer3":
    raise ConfigError("data.format=helpsteer3 holds preferences, not attribute labels: use a"
                      " Bradley-Terry loss (--config.loss=scaled_bt)")
  if (config.data.domains or config.data.languages) and config.data.format != "helpsteer3":
    raise ConfigError("data.domains / data.languages filter HelpSteer3 rows: set"
                      " --config.data.format=helpsteer3 or clear them")
  if config.loss in BT_VARIANTS and config.data.packing:
    raise ConfigError(f"loss={config.loss} puts a preference pair in one row: set"
                      " --config.data.packing=False")
  if config.get("require_init_checkpoint") and not weights.orbax_run(config.init):
    raise ConfigError("this recipe starts from a trained regression model: set"
                      " --config.init.source=<attribute_model workdir>")
  if weights.orbax_run(config.init) and not config.tokenizer \
      and config.model.name != "tiny":
    raise ConfigError(f"initialising a {config.model.name} model from a checkpoint needs"
                      " its tokenizer: set --config.tokenizer=/path/to/the/HF/model/directory")


def _read_pairs(source: str, split: str, config) -> list[preference.PreferencePair]:
  report, data = BadRecordReport(), config.data
  if data.format == "helpsteer3":
    pairs = helpsteer3.read_preference_pairs(
        source, split, domains=helpsteer3.filter_list(data.domains),
        languages=helpsteer3.filter_list(data.languages), on_bad_record=data.on_bad_record,
        report=report)
  else:
    pairs = preference.read_helpsteer2_preference(source, split, data.on_bad_record, report)
  if report.total:
    logging.warning("%s (%s): %s", source, split, report.summary())
  return pairs


def load_data(config, workdir: pathlib.Path, tokenizer) -> tuple[list, list, list, dict]:
  """(train features, eval features, validation records, report) for the loss."""
  data, seq_len = config.data, config.train.seq_len
  if config.loss == "regression":
    train_src, val_src = demo_sources.helpsteer_sources(config, workdir)
    read = functools.partial(load_conversations, config=config)
    make = rm_data.regression_features
    train_records = read(train_src, "train")
    val_records = read(val_src, data.validation_split) if val_src else []
  else:
    train_src, val_src = demo_sources.preference_sources(config, workdir)
    make = rm_data.bt_features
    train_records = _read_pairs(train_src, "train", config)
    val_records = _read_pairs(val_src, data.validation_split, config) if val_src else []
  featurize = functools.partial(make, tokenizer=tokenizer, seq_len=seq_len,
                                truncation=data.truncation, add_bos=data.add_bos)
  train_features, train_report = featurize(train_records)
  eval_features, val_report = featurize(val_records)
  logging.info("train data: %s", train_report.summary())
  logging.info("validation data: %s", val_report.summary())
  return train_features, eval_features, val_records, {"train": train_report.as_dict(),
                                                      "validation": val_report.as_dict()}


def final_evaluation(config, model, rt, tokenizer, val_records) -> tuple[dict, str]:
  """Scores the validation set: attribute metrics or pairwise accuracy."""
  if not val_records:
    return {}, ""
  # A BT row holds both responses: each had half the row in training.
  max_len = config.train.seq_len // (1 if config.loss == "regression" else 2)
  tok = rid.RegressionTokenizer(tokenizer, max_len, config.data.truncation,
                                    config.data.add_bos)
  scorer = ModelScorer(model, rt, tok, config.eval_batch_size)
  if config.loss == "regression":
    result = rm_eval.evaluate_attributes(scorer, val_records)
    return {"attributes": result["metrics"]}, rm_report.attribute_table(result["metrics"])
  weights = [1.0 if a == config.bt_attribute else 0.0 for a in ATTRIBUTES]
  result = rm_eval.evaluate_pairs(scorer, val_records, weights)
  return {"pairs": result}, rm_report.pairs_table("validation pairs", result)


def loss_fn(config: ml_collections.ConfigDict) -> loop.LossFn:
  if config.loss == "regression":
    return regression_loss
  return functools.partial(bt_loss, variant=config.loss, attribute=config.bt_attribute)


def batch_schema(config: ml_collections.ConfigDict) -> tuple[BatchSchema, dict[str, int]]:
  """The step's batch: its schema and axis sizes."""
  schema = REGRESSION_BATCH if config.loss == "regression" else BT_BATCH
  return schema, {"length": config.train.seq_len}


def abstract_train_step(config: ml_collections.ConfigDict,
                        rt: runtime.Runtime) -> abstract_step.StepSpec:
  """The attribute-model (or BT) step on abstract weights and batches."""
  check_config(config)
  model_cfg = runtime.model_config(config, weights=False)
  schema, dims = batch_schema(config)
  return abstract_step.trainer_step_spec(
      config, rt, lambda: reward.reward_model(model_cfg, config.seed, config.head_bias),
      loss_fn(config),
      schema.row_fields(**dims), reward.flops_per_token(model_cfg, config.train.seq_len))


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  check_config(config)
  setup = setup_lib.prepare(config, workdir)
  rt, workdir = setup.rt, setup.workdir
  train_features, eval_features, val_records, data_report = load_data(config, workdir,
                                                                      setup.tokenizer)
  model = loader.load_model(config, rt, loader.REWARD)
  parts = state_lib.split_model(model, rt.mesh, rt.rules)
  del model
  trainer = loop.Trainer(
      config, workdir, rt, parts, loss_fn(config), train_features, eval_features,
      flops_per_token=reward.flops_per_token(setup.model_cfg, config.train.seq_len),
      export_fn=export.hf_exporter(setup.workdir, setup.tokenizer_dir, setup.tokenizer,
                                     parts, config, None, "attribute model",
                                   reward_hf.save_reward_hf))
  result = trainer.run()
  trainer.close()
  # The model the export holds (the best evaluated step with train.export_best)
  params = trainer.params_at(result.exported.step if result.exported else None)
  if processes.is_primary():
    reward_model.save_head(workdir / reward_model.HEAD_FILE, params["head"])
  trained = state_lib.merge_model(parts, params)
  final, table = final_evaluation(config, trained, rt, setup.tokenizer, val_records)
  summary = summary_lib.training_summary(result, loss=config.loss, validation=final,
                                    data=data_report)
  summary_lib.write_summary(workdir / "summary.json", summary,
                       summary_lib.result_line(config, result, f"{config.task} ({config.loss})"),
                       *([table] if table else []),
                       outputs={"head": workdir / "head.npz", **summary_lib.run_outputs(workdir)})
  return summary
