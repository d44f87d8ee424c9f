"""Process-level setup shared by tasks: mesh, rules, model construction."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable

import jax
import ml_collections
from absl import logging
from flax import nnx
from jax.sharding import Mesh

from helpsteer_jax import config_base, processes, saved_params
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax import weights as weights_lib
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import builder, catalog
from helpsteer_jax.models import lora as lora_lib
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.lora import LoraConfig


@dataclasses.dataclass
class Runtime:
  mesh: Mesh
  rules: sharding_lib.Rules


def setup(config: ml_collections.ConfigDict, devices: list | None = None) -> Runtime:
  """Builds the device mesh and sharding rules (fails early on bad sizes).

  `devices` defaults to all devices of all processes; compile-only runs pass
  the devices of a TPU topology description.
  """
  rules = rules_from_config(config)
  mesh = sharding_lib.make_mesh((config.mesh.data, config.mesh.fsdp, config.mesh.tensor),
                                devices)
  logging.info("mesh %s over %d %s devices (%d processes)", dict(mesh.shape),
               mesh.size, mesh.devices.flat[0].platform, jax.process_count())
  from helpsteer_jax.models.attention import check_platform
  for section in (config.get("model"), config.get("scorer", {}).get("model")):
    if section is not None:
      check_platform(section.attention_impl, mesh.devices.flat[0].platform)
  return Runtime(mesh, rules)


def model_config(config: ml_collections.ConfigDict, weights: bool = True) -> ModelConfig:
  """The model config: from the config.json of `init.source` when it is an HF directory,
  else the named model's (`model.name`).

  With `weights=False` (compile-only runs) a recipe that trains published
  weights falls back to the named model's shapes when no HF directory is given.
  """
  if weights and config.get("require_weights") and not config.init.source:
    raise ConfigError(f"this recipe trains the published {config.model.name} weights: set"
                      " --config.init.source=/path/to/the/HF/checkpoint/directory (or a"
                      " training run of them)")
  if hf_dir := weights_lib.hf_dir(config.init):
    from helpsteer_jax.models import hf
    return build_model_config(config.model, hf.config_from_hf(hf_dir), hf_dir)
  cfg = build_model_config(config.model)
  run = weights_lib.orbax_run(config.init)
  if run and weights:
    cfg = _run_shapes(config, cfg, run)
  return cfg


def _run_shapes(config: ml_collections.ConfigDict, cfg: ModelConfig, run: str) -> ModelConfig:
  """`cfg` with the shapes an Orbax run's decoder parameters fix (a reward model's
  backbone's; none for a run of LoRA adapters), the explicitly set ones kept."""
  shapes, _ = saved_params.param_shapes(run, config.init.step)
  if any(k.endswith("_lora") for path in shapes for k in path):
    return cfg
  explicit = [k for k in config_base.SHAPE_FIELDS if config.model.get(k) is not None]
  if {"backbone", "head"} <= {path[0] for path in shapes}:
    # a reward model has no LM head: its backbone's tying is not the checkpoint's to say
    shapes = {path[1:]: shape for path, shape in shapes.items() if path[0] == "backbone"}
    explicit.append("tie_word_embeddings")
  return weights_lib.shaped_config(shapes, cfg, explicit)


def build_model(config: ml_collections.ConfigDict, rt: Runtime,
                cfg: ModelConfig | None = None) -> nnx.Module:
  """The sharded model imported from `init.source` (an HF directory) or randomly
  initialised (as `cfg`, default `model_config(config)`), with LoRA adapters
  (`model.lora`: fresh, or read from `model.lora.adapter`) when set. Tasks build models
  through `load.model.load_model`, which also reads Orbax runs."""
  cfg = cfg or model_config(config)
  builder.validate_model_on_mesh(cfg, rt.mesh, rt.rules)
  base_cfg = dataclasses.replace(cfg, lora=None)
  if hf_dir := weights_lib.hf_dir(config.init):
    from helpsteer_jax.models import hf
    model = nnx.merge(*hf.load_hf_state(hf_dir, base_cfg, rt.mesh, rt.rules))
  else:
    model = builder.init_model(base_cfg, rt.mesh, rt.rules, seed=config.seed)
  return attach_adapters(config, model, rt, cfg.lora)


def attach_adapters(config: ml_collections.ConfigDict, model: nnx.Module, rt: Runtime,
                    lora: LoraConfig | None) -> nnx.Module:
  """`model` (without adapters) with `model.lora`'s adapters, if any."""
  if lora is None:
    return model
  adapters = None
  section = config.model.lora
  if section.adapter:
    from helpsteer_jax.models import peft_adapters
    _, adapters = peft_adapters.read_adapters(section.adapter, model.cfg)
  return builder.with_adapters(model, lora, rt.mesh, rt.rules, seed=config.seed,
                               base_dtype=section.base_dtype or None, adapters=adapters)


def find_tokenizer(explicit: str = "", hf_dir: str = "", run: str = "",
                   workdir: str | pathlib.Path | None = None, key: str = "tokenizer") -> str:
  """The one rule for the tokenizer directory of a model: `explicit` (the config's setting),
  else the HF directory its weights come from, else the training run's (its `hf/` export
  or its demo tokenizer), else the demo tokenizer, written under `workdir` (when given).
  `key` names the setting in the error when none applies."""
  if explicit:
    return explicit
  if hf_dir:
    return hf_dir
  if run:
    found = saved_params.run_tokenizer_dir(run)
    if found is not None:
      return str(found)
  if workdir is None:
    raise ConfigError(f"{run}: the run has no tokenizer files (no {saved_params.HF_EXPORT}/ or"
                      f" {saved_params.DEMO_TOKENIZER}/); set --config.{key}")
  from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
  out = pathlib.Path(workdir) / saved_params.DEMO_TOKENIZER
  if processes.is_primary():  # one writer; the others wait for it
    demo_tokenizer.build_demo_tokenizer(out)
  sync("demo_tokenizer")
  return str(out)


def tokenizer_dir(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> str:
  """`find_tokenizer` for the model of `config` (`tokenizer`, then `init.source`: an HF
  directory or a run)."""
  return find_tokenizer(config.tokenizer, weights_lib.hf_dir(config.init),
                        weights_lib.orbax_run(config.init), workdir)


def sync(name: str) -> None:
  """A barrier across processes (no-op in a single-process run)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def check_tokenizer_fits(tokenizer, vocab_size: int,
                         hint: str = "use a matching tokenizer / model") -> None:
  """A tokenizer with ids beyond the model's embedding table would index garbage."""
  if len(tokenizer) > vocab_size:
    raise ConfigError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size"
                      f" is {vocab_size}; {hint}")


def check_workdir(workdir: str | pathlib.Path) -> None:
  """Fails before any work if the workdir cannot be written."""
  path = pathlib.Path(workdir)
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".write_probe_{jax.process_index()}"
    probe.write_bytes(b"x" * 4096)
    probe.unlink()
  except OSError as e:
    raise ConfigError(f"cannot write to the workdir {path}: {e}; choose another --workdir"
                      " or free some space") from None


def check_free_space(path: str | pathlib.Path, needed_bytes: int, what: str) -> None:
  """Fails before training if `path`'s disk cannot hold `needed_bytes` (e.g. a checkpoint)."""
  import shutil
  free = shutil.disk_usage(path).free
  if free < needed_bytes:
    raise ConfigError(f"{path} has {free / 2**20:.1f} MiB free but {what} needs about"
                      f" {needed_bytes / 2**20:.1f} MiB; free some space or choose another"
                      " --workdir")


def write_once(directory: pathlib.Path, marker: str,
               write: Callable[[pathlib.Path], object]) -> pathlib.Path:
  """Process 0 runs `write(directory)` unless `directory/marker` exists; all wait for it."""
  if processes.is_primary() and not (directory / marker).exists():
    write(directory)
  sync(f"write_once:{directory}")
  return directory


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


def decode_dtype(dtype: str) -> str:
  """`dtype`, with "auto" (the generation and serving presets') resolved: bfloat16 on
  accelerators, float32 on CPU, where bfloat16 greedy output depends on which other rows
  share the batch (XLA:CPU's bf16 GEMMs round differently per row count) while float32's
  does not; bfloat16 is faster there (docs/results.md) and can be asked for."""
  if dtype != "auto":
    return dtype
  return "float32" if jax.default_backend() == "cpu" else "bfloat16"


def build_model_config(model: ml_collections.ConfigDict, base: ModelConfig | None = None,
                       source: str = "the HF checkpoint") -> ModelConfig:
  """`ModelConfig` from the named model (or `base`, read from `source`, e.g. an HF dir) + knobs."""
  overrides = {
      "dtype": decode_dtype(model.dtype),
      "param_dtype": decode_dtype(model.param_dtype),
      "remat_policy": model.remat_policy,
      "scan_layers": model.scan_layers,
      "attention_impl": model.attention_impl,
      "attention_block_size": model.attention_block_size,
  }
  for name in config_base.SHAPE_FIELDS:
    value = model.get(name)
    if value is not None:
      overrides[name] = value
  overrides["lora"] = lora_config(model)
  if base is not None:
    _check_checkpoint_shape(source, base, overrides)
    return dataclasses.replace(base, **overrides)
  return catalog.model_config(model.name, **overrides)


def _check_checkpoint_shape(source: str, base: ModelConfig, overrides: dict[str, Any]) -> None:
  """An HF checkpoint fixes the model's shape: a config that sets another is refused."""
  conflicts = [f"model.{name}={overrides[name]} (the checkpoint has {getattr(base, name)})"
               for name in config_base.SHAPE_FIELDS if name in overrides
               and overrides[name] != getattr(base, name)]
  if conflicts:
    raise ConfigError(
        f"{source} fixes the model's shape, but the config sets "
        f"{'; '.join(conflicts)}. The demo recipes set a tiny shape: start from a recipe"
        " preset for HF weights (e.g. configs/acsft.py:smollm2_135m) or drop these settings")


def rules_from_config(config: ml_collections.ConfigDict) -> sharding_lib.Rules:
  return sharding_lib.normalize_rules(config.sharding_rules)
