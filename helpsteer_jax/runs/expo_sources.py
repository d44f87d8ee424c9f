"""ExPO's two weight sources: what each one is, and whether the two can be combined.

A source is an Orbax run directory of any training task (its latest
checkpoint's `params`) or an HF directory (a causal LM, or the attribute
model as a *ForSequenceClassification). It is a reward model when it holds
the attribute model's head (an attribute_model run, an HF sequence
classifier), else a policy. `inspect` reads only metadata (Orbax's array
metadata, an HF config.json turned into abstract shapes), so that every
problem is named before any weight is read or anything compiles.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
from flax import nnx

from helpsteer_jax import saved_params
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import builder, hf, reward_hf
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.reward import reward_model

POLICY, REWARD = "policy", "reward model"
# What an Orbax run takes from `model.name` (its shapes come from the checkpoint): the
# knobs that change the function and the written config.json.
FAMILY_KNOBS = ("hf_model_type", "rms_norm_eps", "rope_theta", "rope_scaling", "attention_bias",
                "qk_norm", "mlp_activation", "sandwich_norms", "norm_unit_offset",
                "scale_embeddings", "query_pre_attn_scalar", "attn_logit_softcap",
                "final_logit_softcap", "sliding_window")
LORA_REFUSED = (
    "ExPO extrapolates whole weights, and a LoRA run's checkpoint holds only its adapters:"
    " export the run merged (--config.train.export_merged=True writes <workdir>/hf) and"
    " pass that HF directory instead")


@dataclasses.dataclass(frozen=True)
class Source:
  """One side of the extrapolation, known from its metadata alone.

  `shapes` / `dtypes` map each parameter's path ("backbone/layers/attn/q/kernel")
  to its saved shape and dtype; `step` is the Orbax step read (None: HF).
  """
  key: str
  path: pathlib.Path
  kind: str
  hf: bool
  shapes: dict[str, tuple[int, ...]]
  dtypes: dict[str, str]
  step: int | None = None
  hf_config: ModelConfig | None = None  # an HF source's, or the run's hf/ export's

  @property
  def export_dir(self) -> pathlib.Path | None:
    """The HF directory of this model: itself, or the run's `hf/` export if it has one."""
    if self.hf:
      return self.path
    export = saved_params.run_dir(self.path) / saved_params.HF_EXPORT
    return export if (export / "config.json").is_file() else None

  @property
  def tokenizer_dir(self) -> pathlib.Path | None:
    if self.hf:
      return self.path if saved_params.has_tokenizer(self.path) else None
    return saved_params.run_tokenizer_dir(self.path)

  @property
  def hf_dtype(self) -> str:
    """The dtype its weights are stored in (the most common one: a reward head is fp32)."""
    values = list(self.dtypes.values())
    return max(set(values), key=values.count)

  @property
  def head_bias(self) -> bool:
    return "head/bias" in self.shapes


def param_name(key_path) -> str:
  """A parameter's path in a params tree as "backbone/layers/mlp/down_proj"."""
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in key_path)


def _flat(tree) -> dict[str, object]:
  leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))
  return {param_name(path): leaf for path, leaf in leaves}


def _hf_dtype(directory: pathlib.Path) -> str:
  raw = json.loads((directory / "config.json").read_text())
  return str(raw.get("dtype") or raw.get("torch_dtype") or "float32")


def _hf_source(key: str, path: pathlib.Path) -> Source:
  if reward_hf.is_reward_dir(path):
    cfg, kind = reward_hf.reward_config_from_hf(path), REWARD
    _, abstract = builder.abstract_module(lambda: reward_model(cfg, head_bias=False))
  else:
    cfg, kind = hf.config_from_hf(path), POLICY
    _, abstract = builder.abstract_model(cfg)
  dtype = _hf_dtype(path)
  shapes = {k: tuple(v.shape) for k, v in _flat(nnx.to_pure_dict(abstract)).items()}
  return Source(key, path, kind, True, shapes, {k: dtype for k in shapes}, hf_config=cfg)


def _orbax_source(key: str, path: pathlib.Path) -> Source:
  try:
    directory, step = saved_params.resolve(path)
  except ConfigError as e:
    raise ConfigError(f"{key}: {e}; or give an HF directory") from None
  flat = _flat(saved_params.params_metadata(directory, step))
  if any(part.endswith("_lora") for name in flat for part in name.split("/")):
    raise ConfigError(f"{key}={path}: a LoRA run. {LORA_REFUSED}")
  top = {name.split("/")[0] for name in flat}
  kind = REWARD if {"backbone", "head"} <= top else POLICY
  export = saved_params.run_dir(directory) / saved_params.HF_EXPORT
  exported = hf.config_from_hf(export) if (export / "config.json").is_file() else None
  return Source(key, directory, kind, False, {k: tuple(v.shape) for k, v in flat.items()},
                {k: str(v.dtype) for k, v in flat.items()}, step, exported)


def inspect(path: str, key: str) -> Source:
  """The source at `path` (`key` names the setting in errors); ConfigError for a path that
  is none, a PEFT adapter directory or a LoRA run."""
  if not path:
    raise ConfigError(f"{key} is empty: give an Orbax run directory of a training task or an"
                      " HF directory (causal LM or attribute model)")
  where = pathlib.Path(path).expanduser().absolute()
  if not where.exists():
    raise ConfigError(f"{key}={path}: no such directory")
  if (where / "adapter_config.json").is_file():
    raise ConfigError(f"{key}={path}: a PEFT adapter directory. {LORA_REFUSED}")
  if (where / "config.json").is_file() and not (where / saved_params.CHECKPOINTS).is_dir():
    return _hf_source(key, where)
  return _orbax_source(key, where)


def check_compatible(base: Source, tuned: Source) -> None:
  """ConfigError unless both are the same kind with identical parameter trees and shapes,
  naming the first parameter that differs."""
  if base.kind != tuned.kind:
    raise ConfigError(f"{base.key}={base.path} is a {base.kind} but {tuned.key}={tuned.path}"
                      f" is a {tuned.kind}: ExPO needs both ends of one training run")
  for name in [*tuned.shapes, *(n for n in base.shapes if n not in tuned.shapes)]:
    one, two = base.shapes.get(name), tuned.shapes.get(name)
    if one != two:
      raise ConfigError(
          f"{base.key} and {tuned.key} differ first at parameter {name}:"
          f" {one or 'absent'} in {base.path} vs {two or 'absent'} in {tuned.path};"
          " ExPO needs two checkpoints of the same model (the tuned one trained from the"
          " other)")


def check_model_name(sources: tuple[Source, ...], named: ModelConfig, name: str) -> None:
  """An Orbax source is read as `model.name`'s family (`named`): ConfigError when an HF
  config that describes it (its run's export, or the other source's) says otherwise."""
  reference = next((s for s in sources if s.hf and s.hf_config is not None), None)
  for source in sources:
    if source.hf:
      continue
    config, where = source.hf_config, saved_params.run_dir(source.path) / saved_params.HF_EXPORT
    if config is None and reference is not None:
      config, where = reference.hf_config, reference.path
    if config is None:
      continue
    for knob in FAMILY_KNOBS:
      if getattr(config, knob) != getattr(named, knob):
        raise ConfigError(
            f"{source.key}={source.path} is read as model.name={name}, which has"
            f" {knob}={getattr(named, knob)!r}, but {where} says {getattr(config, knob)!r}:"
            " set --config.model.name to the model the run trained")
