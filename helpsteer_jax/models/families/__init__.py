"""The model-family registry, keyed by the HF `model_type`.

One module per family (`llama`, `mistral`, `qwen2`, `qwen3`, `gemma2`) builds
its `Family`: the config conversion (HF `config.json` <-> `ModelConfig`),
the module class (every family so far is the shared `Decoder` with its
knobs set), the parameter mapping used by HF import / export, and the
checkpoint shape inference. Everything outside `models/` goes through this
registry or `models.builder`, never through a family by name. A new family
is a module here plus a line in `FAMILIES`. A family's module is imported when
it is first asked for, so that a run loads the one it uses.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.families.base import Family, ParamMapping, block_ranges
from helpsteer_jax.models.hf_config import (
  UnsupportedCheckpointError,
  architecture,
  common_fields,
  common_to_hf,
  read_hf_config,
)
from helpsteer_jax.registry import LazyRegistry

FAMILIES: Mapping[str, Family] = LazyRegistry({
    model_type: f"{__name__}.{model_type}:FAMILY"
    for model_type in ("llama", "mistral", "qwen2", "qwen3", "gemma2")})

__all__ = ["FAMILIES", "Family", "ParamMapping", "block_ranges",
           "config_from_hf", "config_to_hf", "for_config", "get"]


def get(model_type: str | None) -> Family:
  if model_type not in FAMILIES:
    raise UnsupportedCheckpointError(
        f"HF model_type {model_type!r} is not supported; supported: {sorted(FAMILIES)}")
  return FAMILIES[model_type]


def for_config(cfg: ModelConfig) -> Family:
  """The family of a model config (its `hf_model_type`)."""
  return get(cfg.hf_model_type)


def config_from_hf(path_or_dict: str | os.PathLike | Mapping[str, Any],
                   **overrides: Any) -> ModelConfig:
  """A `ModelConfig` from a HF `config.json` of any registered family.

  `overrides` (e.g. `param_dtype`, `attention_impl`) are applied last.
  Raises `UnsupportedCheckpointError` for features the model lacks.
  """
  raw = read_hf_config(path_or_dict)
  family = get(raw.get("model_type"))
  problems: list[str] = []
  fields = common_fields(raw, problems)
  fields.update(family.knobs)
  fields.update(family.from_hf(raw, problems))
  if problems:
    raise UnsupportedCheckpointError(
        f"Unsupported {family.model_type} checkpoint config: " + "; ".join(problems))
  fields.update(hf_model_type=family.model_type,
                hf_architecture=architecture(raw, family.architecture))
  fields.update(overrides)
  return ModelConfig(**fields)


def config_to_hf(cfg: ModelConfig, dtype: str = "bfloat16") -> dict[str, Any]:
  """A `config.json` dict that transformers 5 (and 4) load into this model.

  Fails if a knob differs from what the family's HF format fixes (a Llama
  with QKV biases has no HF Llama equivalent).
  """
  if cfg.hf_model_type not in FAMILIES:
    raise UnsupportedCheckpointError(f"Cannot export model_type {cfg.hf_model_type!r}")
  family = for_config(cfg)
  for name, value in family.knobs.items():
    if getattr(cfg, name) != value:
      raise UnsupportedCheckpointError(
          f"{name}={getattr(cfg, name)!r} has no HF {family.model_type} equivalent (HF"
          f" {family.model_type} has {name}={value!r})")
  return family.to_hf(cfg, common_to_hf(cfg, dtype))
