"""LoRA adapters in PEFT's format: `adapter_config.json` + `adapter_model.safetensors`.

PEFT names a layer's adapter after the HF weight it adapts
(`base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`, [rank, in];
`...lora_B.weight`, [out, rank]); the family's `ParamMapping` of that weight
gives both the name and how our [in..., rank] / [rank, out...] layouts
flatten to PEFT's. `save_adapters` writes what `peft.PeftModel.from_pretrained`
loads; `read_adapters` reads a PEFT LoRA directory (ours or made elsewhere)
into the pure dict `builder.with_adapters` takes, refusing the PEFT options
this project does not implement.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import jax
import numpy as np

from helpsteer_jax import processes
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import hf
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.families.base import ParamMapping
from helpsteer_jax.models.lora import TARGETS, LoraConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
# PEFT options that change what an adapter computes, with the value we implement.
_REQUIRED = {"peft_type": "LORA", "use_dora": False, "use_rslora": False, "bias": "none",
             "fan_in_fan_out": False, "layers_to_transform": None, "layers_pattern": None,
             "rank_pattern": {}, "alpha_pattern": {}, "use_qalora": False}


def _module_name(target: str) -> str:
  return TARGETS[target][1]  # q -> q_proj, gate -> gate_proj: HF's module names


def _mappings(cfg: ModelConfig) -> dict[str, ParamMapping]:
  by_path = {m.path: m for m in hf.param_mappings(cfg)}
  return {t: by_path[("layers",) + TARGETS[t]] for t in TARGETS}


def _adapter_mappings(weight: ParamMapping, rank: int) -> tuple[ParamMapping, ParamMapping]:
  """(A, B) mappings: ours [in..., rank] <-> PEFT [rank, in], [rank, out...] <-> [out, rank]."""
  base = weight.hf_name.removesuffix(".weight")
  in_axes, out_axes = weight.axes
  return (ParamMapping((), f"{PREFIX}{base}.lora_A.weight", (in_axes, (rank,)), True),
          ParamMapping((), f"{PREFIX}{base}.lora_B.weight", ((rank,), out_axes), True))


def adapter_config(lc: LoraConfig, base_model: str = "", task_type: str = "CAUSAL_LM",
                   modules_to_save: list[str] | None = None) -> dict[str, Any]:
  """The `adapter_config.json` of our LoRA settings."""
  return {"peft_type": "LORA", "task_type": task_type, "base_model_name_or_path": base_model,
          "r": lc.rank, "lora_alpha": lc.alpha, "lora_dropout": lc.dropout,
          "target_modules": [_module_name(t) for t in lc.targets], "bias": "none",
          "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
          "init_lora_weights": True, "modules_to_save": modules_to_save,
          "layers_to_transform": None,
          "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
          "inference_mode": True}


def host_array(x: jax.Array) -> np.ndarray:
  """The whole array on every process (adapters and heads are small)."""
  if x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def save_adapters(cfg: ModelConfig, adapters: dict, out_dir: str | os.PathLike,
                  base_model: str = "", task_type: str = "CAUSAL_LM",
                  extra_tensors: dict[str, np.ndarray] | None = None) -> pathlib.Path:
  """Writes `adapters` (`builder.adapter_params` of the decoder) of a model of `cfg` as a
  PEFT directory.

  Every process gathers the (small) adapters; process 0 writes. `extra_tensors`
  are fully trained modules PEFT keeps whole (`modules_to_save`), by their HF
  names: a sequence classifier's `score.weight`.
  """
  from safetensors.numpy import save_file
  lc = cfg.lora
  if lc is None:
    raise ConfigError("the model has no LoRA adapters to save")
  tensors: dict[str, np.ndarray] = {}
  for target, weight in _mappings(cfg).items():
    if target not in lc.targets:
      continue
    pair = adapters["layers"][TARGETS[target][0]][f"{target}_lora"]
    for mapping, key in zip(_adapter_mappings(weight, lc.rank), ("lora_a", "lora_b")):
      stacked = host_array(pair[key]).astype(np.float32)
      for i in range(cfg.num_layers):
        tensors[mapping.hf_name.format(i=i)] = np.ascontiguousarray(mapping.to_hf(stacked[i]))
  # safetensors writes an array's buffer: a transposed view must be made contiguous.
  tensors.update({f"{PREFIX}{k}": np.ascontiguousarray(v, np.float32)
                  for k, v in (extra_tensors or {}).items()})
  out = pathlib.Path(out_dir)
  if processes.is_primary():
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    saved = sorted({name.rsplit(".", 1)[0] for name in extra_tensors or {}}) or None
    config = adapter_config(lc, base_model, task_type, saved)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
  return out


def read_config(adapter_dir: str | os.PathLike) -> tuple[LoraConfig, dict[str, Any]]:
  """Our `LoraConfig` of a PEFT LoRA directory, and its raw `adapter_config.json`.

  A ConfigError names any option this project does not implement.
  """
  path = pathlib.Path(adapter_dir)
  if not (path / CONFIG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
    raise ConfigError(f"{path} is not a PEFT adapter directory: expected {CONFIG_FILE} and"
                      f" {WEIGHTS_FILE}")
  raw = json.loads((path / CONFIG_FILE).read_text())
  for key, want in _REQUIRED.items():
    got = raw.get(key, want)
    if got != want and not (want in (None, {}) and not got):
      raise ConfigError(f"{path}/{CONFIG_FILE}: {key}={got!r} is not supported (only"
                        f" {want!r}); train or convert the adapter without it")
  modules = raw.get("target_modules")
  names = {_module_name(t): t for t in TARGETS}
  if isinstance(modules, str) or not modules or any(m not in names for m in modules):
    raise ConfigError(f"{path}/{CONFIG_FILE}: target_modules={modules!r}; expected a list of"
                      f" {sorted(names)}")
  targets = tuple(t for t in TARGETS if _module_name(t) in modules)
  lc = LoraConfig(rank=int(raw["r"]), alpha=float(raw["lora_alpha"]), targets=targets,
                  dropout=float(raw.get("lora_dropout") or 0.0))
  return lc, raw


def read_adapters(adapter_dir: str | os.PathLike, cfg: ModelConfig) -> tuple[LoraConfig, dict]:
  """(LoraConfig, adapters as a pure dict of host arrays) of a PEFT directory, checked
  against the base model `cfg` (every tensor present, shapes matching)."""
  from safetensors.numpy import load_file
  lc, _ = read_config(adapter_dir)
  tensors = load_file(str(pathlib.Path(adapter_dir) / WEIGHTS_FILE))
  out: dict = {"layers": {"attn": {}, "mlp": {}}}
  for target, weight in _mappings(cfg).items():
    if target not in lc.targets:
      continue
    pair = {}
    for mapping, key in zip(_adapter_mappings(weight, lc.rank), ("lora_a", "lora_b")):
      layers = []
      for i in range(cfg.num_layers):
        name = mapping.hf_name.format(i=i)
        if name not in tensors:
          raise ConfigError(f"{adapter_dir}: no tensor {name}; the adapter was made for another"
                            " base model (layers or module names differ)")
        if tuple(tensors[name].shape) != mapping.hf_shape:
          raise ConfigError(f"{adapter_dir}: {name} has shape {tuple(tensors[name].shape)}, the"
                            f" base model needs {mapping.hf_shape}; the adapter was made for"
                            " another base model")
        layers.append(mapping.to_ours(tensors[name].astype(np.float32)))
      pair[key] = np.stack(layers)
    out["layers"][TARGETS[target][0]][f"{target}_lora"] = pair
  return lc, out
