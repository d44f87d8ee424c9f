"""What every task does around its own work: setup, demo sources, HF export, the summary.

`prepare` is the preamble (mesh and rules, a writable workdir, the tokenizer
and the model config checked against each other). The `*_sources` helpers
return the configured data, or write the demo data once (process 0) and
return it. `configured_scorer` is the attribute scorer of annotate and
build_2d; `attribute_scorer_at` loads one from a path or URL. `hf_exporter`
is the end-of-training HF export (with the SteerLM chat template of the
run's attributes); `write_summary` writes a task's JSON
summary from process 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
from absl import logging

from helpsteer_jax import reward_runtime, runtime
from helpsteer_jax.data import chat_template
from helpsteer_jax.data.demo import pairs_2d as demo_pairs_2d
from helpsteer_jax.data.demo import rows as demo_rows
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference.attribute_scorer import (
  SCORERS,
  MeshScorer,
  as_mesh_scorer,
  load_scorer,
)
from helpsteer_jax.models import builder, hf, peft_adapters, reward_hf
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.train import state as state_lib


@dataclasses.dataclass
class TaskSetup:
  workdir: pathlib.Path
  rt: runtime.Runtime
  tokenizer_dir: str | None = None
  tokenizer: Any = None
  model_cfg: ModelConfig | None = None


def prepare(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *,
            tokenizer: bool = True, model: bool = True) -> TaskSetup:
  """Mesh and rules, the workdir checked, the tokenizer loaded and checked against the model."""
  setup = TaskSetup(pathlib.Path(workdir), runtime.setup(config))
  runtime.check_workdir(setup.workdir)
  if tokenizer:
    setup.tokenizer_dir = runtime.tokenizer_dir(config, setup.workdir)
    setup.tokenizer = hf.load_tokenizer(setup.tokenizer_dir)
  if model:
    setup.model_cfg = runtime.model_config(config)
    if tokenizer:
      runtime.check_tokenizer_fits(setup.tokenizer, setup.model_cfg.vocab_size)
  return setup


# ---------------------------------------------------------------- data sources


def _configured_or_demo(config: ml_collections.ConfigDict, workdir: pathlib.Path, marker: str,
                        write: Callable) -> tuple[str, str]:
  data = config.data
  if data.train_path:
    return data.train_path, data.validation_path
  demo_dir = runtime.write_once(workdir / "demo_data", marker, lambda d: (
      write(d, data.demo_train_rows, data.demo_validation_rows)))
  return str(demo_dir), str(demo_dir)


def helpsteer_sources(config: ml_collections.ConfigDict,
                      workdir: pathlib.Path) -> tuple[str, str]:
  """(train, validation) HelpSteer-format sources; the demo rows when none is configured."""
  return _configured_or_demo(config, workdir, "validation.jsonl.gz",
                             demo_rows.write_demo_dataset)


def preference_sources(config: ml_collections.ConfigDict,
                       workdir: pathlib.Path) -> tuple[str, str]:
  """(train, validation) HelpSteer2-Preference sources; the demo pairs when none is configured."""
  return _configured_or_demo(config, workdir, "preference/preference.jsonl.gz",
                             demo_rows.write_demo_preference)


def demo_2d_files(workdir: pathlib.Path, num_train: int, num_validation: int) -> tuple[str, str]:
  """(train, validation) HelpSteer-2D demo files, written once."""
  demo_dir = runtime.write_once(workdir / "demo_2d", "validation.jsonl", lambda d: (
      demo_pairs_2d.write_demo_2d(d, num_train, num_validation)))
  return str(demo_dir / "train.jsonl"), str(demo_dir / "validation.jsonl")


# ---------------------------------------------------------------- the attribute scorer

def configured_scorer(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                      what: str) -> MeshScorer:
  """The attribute scorer `config.scorer.factory` names, called on every process.

  `attribute_model`: the project's attribute model (`init.checkpoint` /
  `model.hf_path`, an Orbax run or its HF export) sharded over the mesh. A
  registered name (`http`: a `configs/serve.py` server's attribute model, its
  base URL in `scorer.checkpoint`) or `package.module:function` (called with
  `config.scorer`) is host-side: each process scores its share of a batch.
  """
  factory = config.scorer.factory
  if not factory:
    raise ConfigError(f"{what} needs an attribute scorer: set --config.scorer.factory="
                      f"{reward_runtime.ATTRIBUTE_MODEL} (the project's attribute model, from"
                      " --config.init.checkpoint=<attribute_model run or its HF export>),"
                      " http (with --config.scorer.checkpoint=http://host:port/v1, a server"
                      " started with an attribute model) or package.module:function (a"
                      " function taking config.scorer and returning texts -> [n, 9]"
                      " predictions)")
  if factory != reward_runtime.ATTRIBUTE_MODEL:
    arg = config.scorer.checkpoint if factory in SCORERS else config.scorer
    return as_mesh_scorer(load_scorer(factory, arg, key="scorer.factory"))
  reward_runtime.require_trained(config, what)
  setup = prepare(config, workdir, model=False)
  return reward_runtime.AttributeModelScorer(
      *reward_runtime.build_scorer(config, setup.rt, setup.tokenizer))


def attribute_scorer_at(source: str, rt: runtime.Runtime, batch_size: int,
                        key: str) -> MeshScorer:
  """The attribute model at `source` as a `MeshScorer`: a `configs/serve.py` server's
  base URL (http://host:port/v1, host-side) or an attribute-model workdir or HF
  reward directory (loaded here, sharded over the mesh); `key` names the setting."""
  if str(source).startswith(("http://", "https://")):
    return as_mesh_scorer(load_scorer("http", source, key=key))
  return as_mesh_scorer(reward_runtime.text_scorer(source, rt, batch_size=batch_size, key=key))


# ---------------------------------------------------------------- outputs


def hf_exporter(setup: TaskSetup, parts: state_lib.ModelParts, config: ml_collections.ConfigDict,
                steer: chat_template.SteerSpec | None, what: str = "trained model",
                save: Callable[..., Any] = hf.save_hf_model) -> Callable[[Any], None]:
  """`export(params)`: the trained model for HF tools.

  A full fine-tune goes to `<workdir>/hf`, written by `save(model, out,
  dtype=, tokenizer=)` (a causal LM by default; `reward_hf.save_reward_hf`
  for the attribute model). A LoRA run writes its adapters as a PEFT
  directory `<workdir>/adapter` (with the tokenizer), and with
  `train.export_merged` also the merged model to `<workdir>/hf`. With `steer`
  (the attributes the run trained with) the tokenizer carries the SteerLM
  chat template and config.json the `steerlm` section.
  """

  def with_template(out: pathlib.Path) -> None:
    if steer is not None and jax.process_index() == 0:
      chat_template.export_files(steer, out, add_bos=config.data.add_bos,
                                 turn_marker=chat_template.turn_marker_id(setup.tokenizer))

  def export(params) -> None:
    model = state_lib.merge_model(parts, params)
    decoder = getattr(model, "backbone", model)  # the attribute model's is its backbone
    if state_lib.has_adapters(decoder):
      adapter_dir = setup.workdir / "adapter"
      head = getattr(model, "head", None)  # trained whole: PEFT's modules_to_save
      if head is not None and head.has_bias:
        raise ConfigError(f"cannot export the adapter to {adapter_dir}:"
                          f" {reward_hf.BIAS_REFUSED}")
      peft_adapters.save_adapters(
          decoder.cfg, builder.adapter_params(decoder), adapter_dir,
          base_model=config.model.hf_path, task_type="SEQ_CLS" if head else "CAUSAL_LM",
          extra_tensors=None if head is None
          else {"score.weight": peft_adapters.host_array(head.kernel[...]).T})
      if jax.process_index() == 0:
        hf.save_tokenizer(setup.tokenizer_dir, adapter_dir)
      with_template(adapter_dir)
      logging.info("exported the %s's LoRA adapters to %s", what, adapter_dir)
      if not config.train.export_merged:
        return
      builder.merge_adapters(model)
    out = setup.workdir / "hf"
    save(model, out, dtype=config.train.export_dtype, tokenizer=setup.tokenizer_dir)
    with_template(out)
    logging.info("exported the %s to %s (steerable attributes: %s)", what, out,
                 ", ".join(steer.attributes) if steer else "none")

  return export


def _plain(x):
  """JSON-ready: numpy scalars as Python numbers, NaN as null."""
  if isinstance(x, dict):
    return {k: _plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_plain(v) for v in x]
  if isinstance(x, (float, np.floating)):
    return None if math.isnan(float(x)) else float(x)
  if isinstance(x, np.integer):
    return int(x)
  return x


def write_summary(path: str | pathlib.Path, summary: dict, *lines: str) -> None:
  """Process 0 writes `summary` to `path` (indented JSON) and prints `lines`."""
  if jax.process_index() != 0:
    return
  pathlib.Path(path).write_text(json.dumps(_plain(summary), indent=2) + "\n")
  for line in lines:
    print(line)


def training_summary(result, **extra) -> dict:
  """The fields every training task's summary.json starts with."""
  return {"status": result.status, "step": result.step, "train": result.last_metrics,
          "eval": result.eval_metrics, **extra}


def result_line(config: ml_collections.ConfigDict, result, task: str = "",
                loss: str = "loss") -> str:
  """`task: finished at step N; loss X`, the first line a training task prints."""
  value = result.last_metrics.get("loss", float("nan"))
  return f"{task or config.task}: {result.status} at step {result.step}; {loss} {value:.4f}"
