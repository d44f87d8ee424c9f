"""Where a model's weights are, and what they are, from metadata alone: the one rule.

A weights source is an HF directory (a causal LM, or the attribute model as a
*ForSequenceClassification), an Orbax run of any training task (its workdir or its
`checkpoints/`; a LoRA run holds only adapters), or a PEFT adapter directory.
`inspect` tells them apart and reads their parameter shapes and dtypes (Orbax's
array metadata, an HF config.json as abstract shapes), so that a task names every
problem before any weight is read. `steer_spec` is the one rule for a model's
steerable attributes; `shaped_config` the one for the shapes an Orbax checkpoint
fixes (vocabulary, widths, layers, heads, tied embeddings, QKV bias), which every
loader reads from the checkpoint rather than from `model.name`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
from flax import nnx

from helpsteer_jax import saved_params
from helpsteer_jax.data import chat_template
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import builder, families, hf, reward_hf
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.reward import reward_model

POLICY, REWARD = "policy", "reward model"


@dataclasses.dataclass(frozen=True)
class Source:
  """A model's weights, known from their metadata alone.

  `kind` is POLICY or REWARD; `hf` tells an HF directory from an Orbax run (`path` its
  checkpoint directory); `lora`, a run whose checkpoint holds LoRA adapters (on a base
  it does not hold). `shapes` / `dtypes` map each parameter's path
  ("backbone/layers/attn/q/kernel") to its saved shape and dtype; `step` is the Orbax
  step read (None: HF).
  """
  key: str
  path: pathlib.Path
  kind: str
  hf: bool
  shapes: dict[str, tuple[int, ...]]
  dtypes: dict[str, str]
  step: int | None = None
  hf_config: ModelConfig | None = None  # an HF source's, or the run's hf/ export's
  lora: bool = False

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


def _orbax_source(key: str, path: pathlib.Path, step: int | None = None) -> Source:
  try:
    directory, step = saved_params.resolve(path, step)
  except ConfigError as e:
    raise ConfigError(f"{key}: {e}; or give an HF directory") from None
  flat = _flat(saved_params.params_metadata(directory, step))
  lora = any(part.endswith("_lora") for name in flat for part in name.split("/"))
  top = {name.split("/")[0] for name in flat}
  kind = REWARD if {"backbone", "head"} <= top else POLICY
  export = saved_params.run_dir(directory) / saved_params.HF_EXPORT
  exported = hf.config_from_hf(export) if (export / "config.json").is_file() else None
  return Source(key, directory, kind, False, {k: tuple(v.shape) for k, v in flat.items()},
                {k: str(v.dtype) for k, v in flat.items()}, step, exported, lora)


def inspect(path: str, key: str, step: int | None = None) -> Source:
  """The weights at `path` (`key` names the setting in errors; `step`: an Orbax step,
  None or -1 the latest); ConfigError for a path that holds none. A PEFT adapter
  directory is refused here: it is read with its base (`model.lora.adapter`)."""
  if not path:
    raise ConfigError(f"{key} is empty: give an Orbax run directory of a training task or an"
                      " HF directory (causal LM or attribute model)")
  where = pathlib.Path(path).expanduser().absolute()
  if not where.exists():
    raise ConfigError(f"{key}={path}: no such directory")
  if is_adapter(where):
    raise ConfigError(f"{key}={path}: a PEFT adapter directory; give its base model here"
                      " and the adapter as --config.model.lora.adapter")
  if is_hf_dir(where):
    return _hf_source(key, where)
  return _orbax_source(key, where, None if step is None or step < 0 else step)


def is_hf_dir(path: str | pathlib.Path) -> bool:
  """The one rule that tells an HF directory (a config.json, no `checkpoints/`) from an
  Orbax run (anything else: a run not written yet fails where it is read)."""
  where = pathlib.Path(path).expanduser()
  return (where / "config.json").is_file() and not (where / saved_params.CHECKPOINTS).is_dir()


def hf_dir(section: Any) -> str:
  """`section.source` (a config's `init`, say) if it is an HF directory, else ''."""
  source = str(section.get("source") or "")
  return source if source and is_hf_dir(source) else ""


def orbax_run(section: Any) -> str:
  """`section.source` if it is an Orbax run (any task's workdir or its checkpoints/),
  else ''."""
  source = str(section.get("source") or "")
  return source if source and not is_hf_dir(source) else ""


def is_adapter(path: str | pathlib.Path) -> bool:
  return (pathlib.Path(path).expanduser() / "adapter_config.json").is_file()


def steer_spec(config: Any) -> chat_template.SteerSpec | None:
  """The steerable attributes of the configured model: its PEFT adapter's
  (`model.lora.adapter`), else those of `init.source`: an HF directory's, or the `hf/`
  export of an Orbax run; None when its source declares none (or a fresh model)."""
  model, init = config.get("model") or {}, config.init
  adapter = (model.get("lora") or {}).get("adapter", "") if model else ""
  candidates = [pathlib.Path(adapter)] if adapter else []
  if hf_dir(init):
    candidates.append(pathlib.Path(init.source))
  if orbax_run(init):
    run = pathlib.Path(init.source).expanduser()
    try:
      candidates.append(saved_params.run_dir(run) / saved_params.HF_EXPORT)
    except ConfigError:  # not written yet (a compile-only run): where it will be
      candidates += [run / saved_params.HF_EXPORT, run.parent / saved_params.HF_EXPORT]
  for candidate in candidates:
    spec = chat_template.read_spec(candidate)
    if spec is not None:
      return spec
  return None


def shaped_config(shapes: dict[tuple[str, ...], tuple[int, ...]], base: ModelConfig,
                  explicit: Any = ()) -> ModelConfig:
  """`base` with the shape fields a checkpoint's decoder parameters (`shapes`, by path
  tuple, the decoder's own paths) fix, read by `base`'s family; the fields in `explicit`
  (set in the config) are kept, and the checkpoint's restore then names a mismatch."""
  inferred = checkpoint_shapes(shapes, base)
  return base.replace(**{k: v for k, v in inferred.items() if k not in set(explicit)})


def checkpoint_shapes(shapes: dict[tuple[str, ...], tuple[int, ...]],
                      base: ModelConfig) -> dict[str, Any]:
  """The shape fields decoder parameters of these `shapes` fix, read by `base`'s family."""
  return families.for_config(base).shape_fields(shapes)
