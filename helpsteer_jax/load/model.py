"""`load_model`: every model a task builds, through one weights source.

`init.source` names where the weights are: an HF directory (a causal LM, or the attribute
model's *ForSequenceClassification export) or any training task's Orbax run (its workdir
or its `checkpoints/`, the latest step unless `init.step` is set); `weights` tells which,
from metadata alone. Empty: a fresh `model.name`. An Orbax run's shapes (vocabulary,
widths, layers, heads, tied embeddings, QKV bias) are read from its checkpoint by the
named model's family; the named model supplies the rest (family knobs, RoPE, norm
epsilon, token ids). Shape flags given explicitly must match (a mismatch names the
parameter). LoRA adapters come from `model.lora`: fresh, or a PEFT adapter
(`model.lora.adapter`) on whichever base `init.source` gives.

The role says what the model is for:

- TRAIN: a policy to train (AC-SFT, preference optimisation, online RL, SteerLM 2.0's
  rounds) or a model trained beside one: adapters kept apart from the weights they adapt;
- DECODE: a model to generate, score log-probs or serve with: adapters merged into the
  weights, so that decoding pays nothing per token for them;
- REWARD: the attribute model or a Bradley-Terry model (`load.reward`: backbone and head).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import ml_collections
from flax import nnx

from helpsteer_jax import runtime, saved_params, weights
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.load import reward
from helpsteer_jax.models import builder, hf, reward_hf

TRAIN, DECODE, REWARD = "train", "decode", "reward"
ROLES = (TRAIN, DECODE, REWARD)


def load_model(config: ml_collections.ConfigDict, rt: runtime.Runtime, role: str = TRAIN,
               cfg: Any = None) -> nnx.Module:
  """The sharded model of `config` (`model`, `init`) for `role`; `cfg` (a ModelConfig)
  replaces the one the config and the source give."""
  if role not in ROLES:
    raise ValueError(f"unknown role {role!r}; one of {ROLES}")
  if role == REWARD:
    return reward.build_reward_model(config, rt)
  model = _language_model(config, rt, cfg)
  return builder.merge_adapters(model) if role == DECODE else model


def _language_model(config: ml_collections.ConfigDict, rt: runtime.Runtime,
                    cfg: Any) -> nnx.Module:
  run, hf_dir = weights.orbax_run(config.init), weights.hf_dir(config.init)
  if hf_dir and reward_hf.is_reward_dir(hf_dir):
    raise ConfigError(f"init.source={hf_dir} is an attribute model (HF sequence"
                      " classification), not a language model: give a policy's HF"
                      " directory or run")
  if not run:  # an HF directory, or a fresh model.name
    return runtime.build_model(config, rt, cfg)
  cfg = cfg or runtime.model_config(config)  # the shapes read from the run
  source = weights.inspect(run, "init.source", config.init.step)
  if source.lora:
    raise ConfigError(f"init.source={run} holds LoRA adapters only: set"
                      " --config.init.source=<its base> with --config.model.lora.adapter="
                      "<the run's adapter/ export>, or export it merged"
                      " (train.export_merged) and start from that HF directory")
  if source.kind == weights.REWARD:
    raise ConfigError(f"init.source={run} is an attribute model (a backbone and a head),"
                      " not a language model: give a policy's run or HF directory")
  builder.validate_model_on_mesh(cfg, rt.mesh, rt.rules)
  graphdef, abstract = builder.abstract_model(dataclasses.replace(cfg, lora=None))
  shardings = nnx.to_pure_dict(builder.state_shardings(abstract, rt.mesh, rt.rules))
  target = sharding_lib.abstract_arrays(nnx.to_pure_dict(abstract), shardings)
  params, _ = saved_params.restore_params(source.path, target, source.step)
  nnx.replace_by_pure_dict(abstract, params)
  return runtime.attach_adapters(config, nnx.merge(graphdef, abstract), rt, cfg.lora)


def load_with_tokenizer(config: ml_collections.ConfigDict, rt: runtime.Runtime,
                        workdir: str | pathlib.Path) -> tuple[nnx.Module, Any, int]:
  """(the DECODE model, its tokenizer checked against it, the pad id: 0 when none)."""
  tokenizer = hf.load_tokenizer(runtime.tokenizer_dir(config, workdir))
  model = load_model(config, rt, DECODE)
  runtime.check_tokenizer_fits(tokenizer, model.cfg.vocab_size, "use the training run's tokenizer")
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  return model, tokenizer, int(pad)
