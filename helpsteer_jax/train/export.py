"""The end-of-training export: the trained model as an HF directory or PEFT adapters."""

from __future__ import annotations

import pathlib
from typing import Any, Callable

import ml_collections
from absl import logging

from helpsteer_jax import processes, weights
from helpsteer_jax.data import chat_template
from helpsteer_jax.models import builder, hf, peft_adapters
from helpsteer_jax.train import state as state_lib


def hf_exporter(workdir: pathlib.Path, tokenizer_dir: str | Any, tokenizer: Any,
                parts: state_lib.ModelParts, config: ml_collections.ConfigDict,
                steer: chat_template.SteerSpec | None, what: str = "trained model",
                save: Callable[..., Any] = hf.save_hf_model) -> Callable[[Any], None]:
  """`export(params)`: the trained model for HF tools (`tokenizer_dir` is copied with it,
  or saved when it is a tokenizer object, e.g. one with tokens added in training;
  `tokenizer` locates the chat template's turn marker).

  A full fine-tune goes to `<workdir>/hf`, written by `save(model, out,
  dtype=, tokenizer=)` (a causal LM by default; `reward_hf.save_reward_hf`
  for the attribute model). A LoRA run writes its adapters as a PEFT
  directory `<workdir>/adapter` (with the tokenizer), and with
  `train.export_merged` also the merged model to `<workdir>/hf`. With `steer`
  (the attributes the run trained with) the tokenizer carries the SteerLM
  chat template and config.json the `steerlm` section.
  """

  def with_template(out: pathlib.Path) -> None:
    if steer is not None and processes.is_primary():
      chat_template.export_files(steer, out, add_bos=config.data.add_bos,
                                 turn_marker=chat_template.turn_marker_id(tokenizer))

  def export(params) -> None:
    model = state_lib.merge_model(parts, params)
    decoder = getattr(model, "backbone", model)  # the attribute model's is its backbone
    if state_lib.has_adapters(decoder):
      adapter_dir = workdir / "adapter"
      # Trained whole: PEFT's modules_to_save. A head with a bias never gets here: the
      # attribute_model task refuses head_bias with an HF export before training.
      head = getattr(model, "head", None)
      peft_adapters.save_adapters(
          decoder.cfg, builder.adapter_params(decoder), adapter_dir,
          base_model=weights.hf_dir(config.init), task_type="SEQ_CLS" if head else "CAUSAL_LM",
          extra_tensors=None if head is None
          else {"score.weight": peft_adapters.host_array(head.kernel[...]).T})
      if processes.is_primary():
        hf.save_tokenizer(tokenizer_dir, adapter_dir)
      with_template(adapter_dir)
      logging.info("exported the %s's LoRA adapters to %s", what, adapter_dir)
      if not config.train.export_merged:
        return
      builder.merge_adapters(model)
    out = workdir / "hf"
    save(model, out, dtype=config.train.export_dtype, tokenizer=tokenizer_dir)
    with_template(out)
    logging.info("exported the %s to %s (steerable attributes: %s)", what, out,
                 ", ".join(steer.attributes) if steer else "none")

  return export
