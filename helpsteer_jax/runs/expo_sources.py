"""ExPO's two weight sources (`weights.Source`): whether the two can be combined.

A source is an Orbax run directory of any training task (its latest
checkpoint's `params`) or an HF directory (a causal LM, or the attribute
model as a *ForSequenceClassification). It is a reward model when it holds
the attribute model's head (an attribute_model run, an HF sequence
classifier), else a policy. Everything is read from metadata
(`weights.inspect`), so that every problem is named before any weight is read
or anything compiles; whole weights only (a LoRA run or an adapter is refused).
"""

from __future__ import annotations

from helpsteer_jax import saved_params, weights
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.weights import POLICY, REWARD, Source, param_name  # noqa: F401 - ExPO's API

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


def inspect(path: str, key: str) -> Source:
  """The source at `path` (`key` names the setting in errors); ConfigError for a path that
  is none, a PEFT adapter directory or a LoRA run."""
  if path and weights.is_adapter(path):
    raise ConfigError(f"{key}={path}: a PEFT adapter directory. {LORA_REFUSED}")
  source = weights.inspect(path, key)
  if source.lora:
    raise ConfigError(f"{key}={path}: a LoRA run. {LORA_REFUSED}")
  return source


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
