"""The family-independent half of HF `config.json` <-> `ModelConfig`.

Each family (`models/families`) adds its own keys and checks; the
dispatch on `model_type` is `families.config_from_hf` / `config_to_hf`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Mapping

import jax.numpy as jnp

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models.config import ModelConfig, RopeScaling

logger = logging.getLogger(__name__)


class UnsupportedCheckpointError(ConfigError):
  """A HF config asks for something this model does not implement."""


def read_hf_config(path_or_dict: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
  """The raw `config.json` dict of a checkpoint directory, file or dict."""
  if isinstance(path_or_dict, Mapping):
    return dict(path_or_dict)
  path = os.fspath(path_or_dict)
  if os.path.isdir(path):
    path = os.path.join(path, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"No HF config.json at {path}")
  with open(path) as f:
    return json.load(f)


def _rope_from_hf(raw: Mapping[str, Any], problems: list[str]
                  ) -> tuple[float, RopeScaling | None]:
  """RoPE theta and scaling from v5 `rope_parameters` or v4 `rope_scaling`."""
  params = raw.get("rope_parameters")
  if params is None:
    params = dict(raw.get("rope_scaling") or {})
  elif params and all(isinstance(v, Mapping) for v in params.values()):
    problems.append("per-layer-type rope_parameters are not supported")
    return 10000.0, None
  theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
  rope_type = params.get("rope_type", params.get("type", "default"))
  if rope_type == "default":
    return theta, None
  if rope_type == "llama3":
    d = RopeScaling()
    return theta, RopeScaling(
        factor=float(params.get("factor", d.factor)),
        low_freq_factor=float(params.get("low_freq_factor", d.low_freq_factor)),
        high_freq_factor=float(params.get("high_freq_factor", d.high_freq_factor)),
        original_max_position_embeddings=int(params.get(
            "original_max_position_embeddings", d.original_max_position_embeddings)))
  problems.append(f"rope_type={rope_type!r} (only 'default' and 'llama3' are"
                  " implemented)")
  return theta, None


def common_fields(raw: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
  """The `ModelConfig` fields every family's `config.json` spells the same way."""
  heads = int(raw["num_attention_heads"])
  rope_theta, rope_scaling = _rope_from_hf(raw, problems)
  return dict(
      vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
      intermediate_size=int(raw["intermediate_size"]),
      num_layers=int(raw["num_hidden_layers"]), num_heads=heads,
      num_kv_heads=int(raw.get("num_key_value_heads") or heads),
      head_dim=raw.get("head_dim"),
      rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
      rope_theta=rope_theta, rope_scaling=rope_scaling,
      max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
      tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
      bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"),
      pad_token_id=raw.get("pad_token_id"),
      initializer_range=float(raw.get("initializer_range", 0.02)))


def check_activation(raw: Mapping[str, Any], key: str, allowed: tuple[str, ...],
                     problems: list[str], default: str) -> None:
  act = raw.get(key, default)
  if act not in allowed:
    problems.append(f"{key}={act!r} (only {allowed[0]!r} is implemented for this family)")


def architecture(raw: Mapping[str, Any], default: str) -> str:
  """The causal-LM class name from `architectures` (the family's if it is another head).

  A *ForSequenceClassification checkpoint (a reward model) has the same
  backbone under the causal LM's name.
  """
  arch = (raw.get("architectures") or [default])[0]
  if arch.endswith("ForSequenceClassification"):
    return arch.removesuffix("ForSequenceClassification") + "ForCausalLM"
  if not arch.endswith("ForCausalLM"):
    logger.warning("Checkpoint architecture %s is not a causal LM; importing"
                   " the decoder as %s", arch, default)
    arch = default
  return arch


def common_to_hf(cfg: ModelConfig, dtype: str = "bfloat16") -> dict[str, Any]:
  """The `config.json` keys every family writes the same way.

  RoPE is written both as v5 `rope_parameters` and v4 `rope_theta` /
  `rope_scaling`; transformers 5 reads them consistently.
  """
  rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  if cfg.rope_scaling is not None:
    rope = {"rope_type": "llama3", "rope_theta": cfg.rope_theta,
            **dataclasses.asdict(cfg.rope_scaling)}
  eos = list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id
  return dict(
      architectures=[cfg.hf_architecture], model_type=cfg.hf_model_type,
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
      intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim,
      max_position_embeddings=cfg.max_position_embeddings,
      initializer_range=cfg.initializer_range, rms_norm_eps=cfg.rms_norm_eps,
      rope_parameters=rope, rope_theta=cfg.rope_theta,
      rope_scaling={k: v for k, v in rope.items() if k != "rope_theta"}
      if cfg.rope_scaling is not None else None,
      tie_word_embeddings=cfg.tie_word_embeddings, bos_token_id=cfg.bos_token_id,
      eos_token_id=eos, pad_token_id=cfg.pad_token_id, attention_dropout=0.0,
      use_cache=True, dtype=str(jnp.dtype(dtype)))


def generation_config(cfg: ModelConfig) -> dict[str, Any]:
  eos = list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id
  out = {"_from_model_config": True, "bos_token_id": cfg.bos_token_id,
         "eos_token_id": eos}
  if cfg.pad_token_id is not None:
    out["pad_token_id"] = cfg.pad_token_id
  return out
