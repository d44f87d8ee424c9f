"""Config pieces shared by every task file in `configs/`.

Task files build their `ConfigDict` from these so that model, mesh and
sharding settings are spelled the same way everywhere, and so that every
field exists (ml-collections rejects command-line keys that do not).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections
from ml_collections.config_dict import placeholder

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import lora as lora_lib
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.lora import LoraConfig
from helpsteer_jax.models.presets import get_preset

# ModelConfig fields a user may override from the command line.
_SHAPE_FIELDS = {
    "vocab_size": int, "hidden_size": int, "intermediate_size": int,
    "num_layers": int, "num_heads": int, "num_kv_heads": int, "head_dim": int,
    "max_position_embeddings": int, "rope_theta": float, "rms_norm_eps": float,
    "tie_word_embeddings": bool,
}


def unknown_preset(task: str, preset: str, presets: tuple[str, ...]) -> ConfigError:
  """The error a task file's `get_config` raises for a preset it does not have."""
  return ConfigError(f"unknown {task} preset {preset!r}; choose one of {', '.join(presets)}")


def model_section(preset: str = "tiny", **knobs: Any) -> ml_collections.ConfigDict:
  """The `config.model` section: a preset or an HF directory, plus knobs."""
  section = ml_collections.ConfigDict()
  section.preset = preset
  section.hf_path = ""  # a local HF directory (or hub id) to import weights from
  section.dtype = "float32"
  section.param_dtype = "float32"
  section.remat_policy = "none"
  section.scan_layers = True
  section.attention_impl = "blockwise"
  section.attention_block_size = 128
  for name, typ in _SHAPE_FIELDS.items():
    setattr(section, name, placeholder(typ))
  section.lora = lora_section()
  section.update(knobs)
  return section


def lora_section(**overrides: Any) -> ml_collections.ConfigDict:
  """`config.model.lora`: LoRA adapters (models/lora.py); rank 0 = full fine-tuning."""
  section = ml_collections.ConfigDict(dict(
      rank=0,
      alpha=16.0,             # scale alpha / rank
      dropout=0.0,
      targets="all",          # comma-separated subset of q,k,v,o,gate,up,down
      base_dtype="",          # e.g. "bfloat16": frozen base weights stored in it
      adapter="",             # a PEFT LoRA directory to start from (or to generate with)
  ))
  section.update(overrides)
  return section


def lora_config(model: ml_collections.ConfigDict) -> LoraConfig | None:
  """The `LoraConfig` of `config.model.lora` (None for rank 0 without an adapter).

  An adapter directory brings its own settings; rank / alpha / targets given
  as well must agree with it.
  """
  section = model.get("lora")
  if section is None or (not section.rank and not section.adapter):
    return None
  if section.adapter:
    from helpsteer_jax.models import peft_adapters
    saved, _ = peft_adapters.read_config(section.adapter)
    if section.rank and section.rank != saved.rank:
      raise ConfigError(f"model.lora.rank={section.rank} but the adapter {section.adapter} has"
                        f" rank {saved.rank}: drop model.lora.rank (the adapter sets it)")
    return saved
  return LoraConfig(rank=int(section.rank), alpha=float(section.alpha),
                    targets=lora_lib.parse_targets(section.targets),
                    dropout=float(section.dropout))


def mesh_config(data: int = 1, fsdp: int = -1, tensor: int = 1) -> ml_collections.ConfigDict:
  """The `config.mesh` section: sizes of the data / fsdp / tensor axes."""
  return ml_collections.ConfigDict(dict(data=data, fsdp=fsdp, tensor=tensor))


def data_config(**overrides: Any) -> ml_collections.ConfigDict:
  """The `config.data` section: sources, format and what to do with bad rows."""
  section = ml_collections.ConfigDict(dict(
      train_path="",        # file, HF-layout directory, or hub id; "" = the demo data
      validation_path="",   # "" with train_path set = no evaluation
      validation_split="validation",
      format="auto",        # "helpsteer" | "steerlm" | "auto" | "tfds"
      tfds_source_dir="",   # format "tfds": build train_path from these jsonl.gz files
      on_bad_record="error",  # or "skip" (counted and reported)
      truncation="truncate_left",  # or "drop"
      packing=True,
      add_bos=True,
      demo_train_rows=2000,
      demo_validation_rows=200,
  ))
  section.update(overrides)
  return section


def base_config(task: str) -> ml_collections.ConfigDict:
  """Fields every task has."""
  config = ml_collections.ConfigDict()
  config.task = task
  config.seed = 0
  config.model = model_section()
  config.mesh = mesh_config()
  config.sharding_rules = tuple(sharding_lib.DEFAULT_RULES)
  config.tokenizer = ""  # HF tokenizer directory; "" = the model's or the demo one
  from helpsteer_jax.distributed import distributed_config
  config.distributed = distributed_config()
  # Ahead-of-time compilation for a TPU topology instead of running (aot.py).
  config.compile_only = False
  config.compile_topology = ""  # e.g. v5p-128, v5e-256, v5e:2x2
  config.compile_slices = 1
  config.compile_flops = True   # also count the step's FLOPs (two small extra compiles)
  return config


def build_model_config(model: ml_collections.ConfigDict,
                       base: ModelConfig | None = None) -> ModelConfig:
  """`ModelConfig` from the preset (or `base`, e.g. read from an HF dir) + knobs."""
  overrides = {
      "dtype": model.dtype,
      "param_dtype": model.param_dtype,
      "remat_policy": model.remat_policy,
      "scan_layers": model.scan_layers,
      "attention_impl": model.attention_impl,
      "attention_block_size": model.attention_block_size,
  }
  for name in _SHAPE_FIELDS:
    value = model.get(name)
    if value is not None:
      overrides[name] = value
  overrides["lora"] = lora_config(model)
  if base is not None:
    _check_checkpoint_shape(model, base, overrides)
    return dataclasses.replace(base, **overrides)
  return get_preset(model.preset, **overrides)


def _check_checkpoint_shape(model: ml_collections.ConfigDict, base: ModelConfig,
                            overrides: dict[str, Any]) -> None:
  """An HF checkpoint fixes the model's shape: a config that sets another is refused."""
  conflicts = [f"model.{name}={overrides[name]} (the checkpoint has {getattr(base, name)})"
               for name in _SHAPE_FIELDS if name in overrides
               and overrides[name] != getattr(base, name)]
  if conflicts:
    raise ConfigError(
        f"{model.hf_path} fixes the model's shape, but the config sets "
        f"{'; '.join(conflicts)}. The demo recipes set a tiny shape: start from a recipe"
        " preset for HF weights (e.g. configs/acsft.py:smollm2_135m) or drop these settings")


def rules_from_config(config: ml_collections.ConfigDict) -> sharding_lib.Rules:
  return sharding_lib.normalize_rules(config.sharding_rules)
