"""The config layer's base: the sections every task file builds on.

Task files (`configs/*.py`) build their `ConfigDict` from this module and
`config_sections` and import nothing else, so loading a config (and `--help`,
which loads them all) loads neither JAX nor any runtime module: both modules
sit at the bottom of the import order. The sections spell model, mesh, data
and sharding settings the same way in every task, and every field exists
(ml-collections rejects command-line keys that do not). Turning a section
into runtime objects (ModelConfig, LoraConfig, sharding rules) is `runtime`'s.
"""

from __future__ import annotations

from typing import Any

import ml_collections
from ml_collections.config_dict import placeholder

from helpsteer_jax.errors import ConfigError

# Logical axis -> mesh axes (sharding.py applies them; a config may override them).
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),
    ("segments", None),
    ("attributes", None),
    ("lora_rank", None),
)

# ModelConfig fields a user may override from the command line.
SHAPE_FIELDS = {
    "vocab_size": int, "hidden_size": int, "intermediate_size": int,
    "num_layers": int, "num_heads": int, "num_kv_heads": int, "head_dim": int,
    "max_position_embeddings": int, "rope_theta": float, "rms_norm_eps": float,
    "tie_word_embeddings": bool,
}


def unknown_preset(task: str, preset: str, presets: tuple[str, ...]) -> ConfigError:
  """The error a task file's `get_config` raises for a preset it does not have."""
  return ConfigError(f"unknown {task} preset {preset!r}; choose one of {', '.join(presets)}")


def model_section(name: str = "tiny", **knobs: Any) -> ml_collections.ConfigDict:
  """The `config.model` section: a named model (models/catalog.py) or an HF directory's
  (`init.source`), plus knobs."""
  section = ml_collections.ConfigDict()
  section.name = name
  section.dtype = "float32"
  section.param_dtype = "float32"
  section.remat_policy = "none"
  section.scan_layers = True
  section.attention_impl = "blockwise"
  section.attention_block_size = 128
  for name, typ in SHAPE_FIELDS.items():
    setattr(section, name, placeholder(typ))
  section.lora = lora_section()
  section.update(knobs)
  return section


def init_section(**overrides: Any) -> ml_collections.ConfigDict:
  """`config.init`: where the weights of the task's model come from (none: random init)."""
  section = ml_collections.ConfigDict(dict(
      # an HF directory (its config.json fixes the shape) or any training task's Orbax
      # run (its workdir or checkpoints/; the shapes read from it): detected, as
      # weights.inspect does; "" = a fresh model.name
      source="",
      step=-1))  # an Orbax run's step; -1 = the latest
  section.update(overrides)
  return section


# Renamed keys of a task's model: where its weights come from (now `config.init`) and its
# name (main.py names the new key when an old one is given).
MODEL_RENAMED = {"init.hf_path": "init.source", "init.checkpoint": "init.source",
                 "model.hf_path": "init.source", "model.init_checkpoint": "init.source",
                 "checkpoint": "init.source", "checkpoint_step": "init.step",
                 "model.preset": "model.name"}


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


def distributed_config(**overrides) -> ml_collections.ConfigDict:
  """The `config.distributed` section (distributed.py: joining the process group)."""
  section = ml_collections.ConfigDict(dict(
      mode="auto", coordinator_address="", num_processes=-1, process_id=-1,
      local_device_ids="", initialization_timeout=300, heartbeat_timeout=100))
  section.update(overrides)
  return section


def compile_cache_section(directory: str = "") -> ml_collections.ConfigDict:
  """JAX's persistent compilation cache (`compile_cache.py`): off unless `dir` is set."""
  return ml_collections.ConfigDict(dict(
      dir=directory,           # "workdir" = <workdir>/compile_cache, a path, or "" = off
      min_compile_secs=0.0))   # programs that compile faster are not written


def base_config(task: str) -> ml_collections.ConfigDict:
  """Fields every task has."""
  config = ml_collections.ConfigDict()
  config.task = task
  config.seed = 0
  config.model = model_section()
  config.init = init_section()
  config.mesh = mesh_config()
  config.sharding_rules = DEFAULT_RULES
  config.tokenizer = ""  # HF tokenizer directory; "" = the model's or the demo one
  config.distributed = distributed_config()
  config.compile_cache = compile_cache_section()
  # Ahead-of-time compilation for a TPU topology instead of running (aot.py).
  config.compile_only = False
  config.compile_topology = ""  # e.g. v5p-128, v5e-256, v5e:2x2
  config.compile_slices = 1
  config.compile_flops = True   # also count the step's FLOPs (two small extra compiles)
  # The run checks' escapes (main.py), comma-separated keys or sections: settings a rerun
  # may change and still resume the workdir's run (run_fingerprint.py), and given keys
  # this run does not read that it may go on without (config_reads.py).
  config.allow_changed = ""
  config.allow_unread = ""
  return config
