"""The model to generate with: an HF directory or a training task's Orbax checkpoint.

`config.init.hf_path` imports a Hugging Face directory (e.g. the `hf/`
export every training task writes). `config.init.checkpoint` restores only the
parameters of an Orbax checkpoint written by any training task: a task's
workdir or its `checkpoints/` directory, the latest step unless
`config.init.step` is set. The shapes (vocabulary, widths, layers,
heads, tied embeddings, QKV bias) are read from the checkpoint's metadata
by the named model's family; the named model supplies the rest (family knobs,
RoPE, norm epsilon, token ids), so pass the training run's `model.name`.
Shape flags given explicitly must match the checkpoint (a mismatch names
the parameter that differs). `steer_spec` finds the model's steerable
attributes: the `steerlm` section of the HF directory, or of the `hf/`
export of the checkpoint's training run.
"""

from __future__ import annotations

import pathlib
from typing import Any

import ml_collections
from flax import nnx

from helpsteer_jax import config_base, runtime, saved_params, weights
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.data import chat_template
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import builder, hf


def load_model(config: ml_collections.ConfigDict, rt: runtime.Runtime) -> nnx.Module:
  """The sharded model from `config.init.checkpoint`, `init.hf_path` or `model.name`; with a
  PEFT adapter (`model.lora.adapter`) merged into the weights it adapts, so that
  decoding pays nothing per token for it."""
  if config.init.checkpoint and config.init.hf_path:
    raise ConfigError("set either --config.init.checkpoint (Orbax) or --config.init.hf_path"
                      " (HF directory), not both")
  if config.init.checkpoint and config.model.lora.adapter:
    raise ConfigError("model.lora.adapter goes on an HF base: set --config.init.hf_path"
                      " instead of --config.init.checkpoint")
  if not config.init.checkpoint:
    return builder.merge_adapters(runtime.build_model(config, rt))
  directory = saved_params.checkpoint_dir(config.init.checkpoint)
  shapes, step = saved_params.param_shapes(directory, config.init.step)
  explicit = [k for k in config_base.SHAPE_FIELDS if config.model.get(k) is not None]
  cfg = weights.shaped_config(shapes, runtime.model_config(config), explicit)
  builder.validate_model_on_mesh(cfg, rt.mesh, rt.rules)
  graphdef, abstract = builder.abstract_model(cfg)
  shardings = nnx.to_pure_dict(builder.state_shardings(abstract, rt.mesh, rt.rules))
  target = sharding_lib.abstract_arrays(nnx.to_pure_dict(abstract), shardings)
  params, _ = saved_params.restore_params(directory, target, step)
  nnx.replace_by_pure_dict(abstract, params)
  return nnx.merge(graphdef, abstract)


def load_with_tokenizer(config: ml_collections.ConfigDict, rt: runtime.Runtime,
                        workdir: str | pathlib.Path) -> tuple[nnx.Module, Any, int]:
  """(`load_model`'s model, its tokenizer checked against it, the pad id: 0 when none)."""
  tokenizer = hf.load_tokenizer(runtime.tokenizer_dir(config, workdir))
  model = load_model(config, rt)
  runtime.check_tokenizer_fits(tokenizer, model.cfg.vocab_size, "use the training run's tokenizer")
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  return model, tokenizer, int(pad)


def steer_spec(config: ml_collections.ConfigDict) -> chat_template.SteerSpec | None:
  """The steerable attributes the model's source declares (`weights.steer_spec`, the one
  rule; None: it declares none)."""
  return weights.steer_spec(config)
