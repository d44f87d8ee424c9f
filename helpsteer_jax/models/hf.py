"""Hugging Face checkpoint import / export for every registered family.

Import streams a safetensors checkpoint onto a device mesh one tensor (and
for stacked layer parameters one layer) at a time, so the host never holds
more than one layer's tensor and every parameter is born sharded; each
process reads only the blocks of that tensor its own devices hold. Export
gathers one layer of one parameter at a time (onto every process) and
process 0 streams it into safetensors files that
`transformers.AutoModelForCausalLM` loads. What differs between families
(config keys, tensor names) comes from `models.families`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from helpsteer_jax import processes
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import builder, families
from helpsteer_jax.models import safetensors_io as st
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.families import (
  ParamMapping,
  block_ranges,
  config_from_hf,
  config_to_hf,
)
from helpsteer_jax.models.hf_config import (
  UnsupportedCheckpointError,
  generation_config,
  read_hf_config,
)

__all__ = [
    "CheckpointError", "ParamMapping", "TOKENIZER_FILES",
    "UnsupportedCheckpointError", "config_from_hf", "config_to_hf",
    "copy_tokenizer_files", "generation_config", "hf_tensor_names",
    "load_hf_model", "load_hf_state", "load_tokenizer", "param_mappings",
    "read_hf_config", "read_params", "save_hf_model", "tensor_order", "write_checkpoint",
    "check_tensors",
]

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json", "vocab.json",
                   "merges.txt", "chat_template.jinja", "chat_template.json")


class CheckpointError(ConfigError):
  """A checkpoint tensor is missing or has an unexpected shape."""


def param_mappings(cfg: ModelConfig) -> list[ParamMapping]:
  """Every parameter of `cfg`'s model with its HF name and layout (per family)."""
  return families.for_config(cfg).param_mappings(cfg)


def hf_tensor_names(cfg: ModelConfig) -> list[str]:
  """HF tensor names in checkpoint order (embeddings, layer by layer, head)."""
  return [name for name, _, _ in _hf_order(cfg)]


def _hf_order(cfg: ModelConfig) -> list[tuple[str, ParamMapping, int | None]]:
  return tensor_order(param_mappings(cfg), cfg.num_layers)


def tensor_order(maps: list[ParamMapping], num_layers: int
                 ) -> list[tuple[str, ParamMapping, int | None]]:
  """(HF name, mapping, layer or None) in checkpoint order: embeddings, layer by layer,
  the rest."""
  embed = [m for m in maps if m.path[-1] == "embed"]
  out = [(m.hf_name, m, None) for m in embed]
  for i in range(num_layers):
    out += [(m.hf_name.format(i=i), m, i) for m in maps if m.layered]
  out += [(m.hf_name, m, None) for m in maps if not m.layered and m not in embed]
  return out


# ---------------------------------------------------------------------------
# Import.


@functools.lru_cache(maxsize=None)
def _zeros_fn(shape: tuple[int, ...], dtype: Any, sharding: NamedSharding):
  return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)


@functools.lru_cache(maxsize=None)
def _insert_fn(sharding: NamedSharding):
  def insert(full, layer, i):
    return jax.lax.dynamic_update_index_in_dim(full, layer.astype(full.dtype), i, 0)
  return jax.jit(insert, donate_argnums=0, out_shardings=sharding)


def _read_sharded(reader: st.CheckpointReader, m: ParamMapping, name: str,
                  sharding: NamedSharding, dtype: np.dtype) -> jax.Array:
  """HF tensor `name` as our `m.shape` on `sharding`.

  Reads only the blocks this process's devices hold, each distinct block once
  (replicas share it).
  """
  blocks: dict[tuple[tuple[int, int], ...], np.ndarray] = {}

  def block(index: st.Index) -> np.ndarray:
    key = block_ranges(index, m.shape)
    if key not in blocks:
      blocks[key] = m.read(lambda hf_index: reader.get(name, hf_index), index).astype(
          dtype, copy=False)
    return blocks[key]

  return jax.make_array_from_callback(m.shape, sharding, block)


def check_tensors(reader: st.CheckpointReader, order: list[tuple[str, ParamMapping, Any]],
                  ignored: frozenset[str] = frozenset()) -> None:
  """CheckpointError unless every tensor of `order` is there with its shape."""
  expected = {name: m.hf_shape for name, m, _ in order}
  missing = [n for n in expected if n not in reader]
  if missing:
    raise CheckpointError(
        f"Checkpoint {reader.source} is missing tensor {missing[0]!r}"
        + (f" (and {len(missing) - 1} more: {missing[1:6]})" if len(missing) > 1 else ""))
  for name, shape in expected.items():
    got = reader.info(name).shape
    if got != shape:
      raise CheckpointError(
          f"Tensor {name!r} in {reader.file_of(name)} has shape {got}; expected"
          f" {shape} for this config")
  extra = sorted(set(reader.names()) - set(expected) - ignored)
  if extra:
    logger.warning("Ignoring %d checkpoint tensors not used by the model: %s",
                   len(extra), extra)


def read_params(reader: st.CheckpointReader, maps: list[ParamMapping], num_layers: int,
                abstract: nnx.State, mesh: Mesh, rules: sharding_lib.Rules) -> nnx.State:
  """`abstract` (a module's abstract state) filled from `reader` through `maps`.

  Each tensor is read in its parameter's dtype, only the blocks this
  process's devices hold; stacked layer parameters one layer at a time into
  a sharded buffer.
  """
  shardings = dict(nnx.to_flat_state(builder.state_shardings(abstract, mesh, rules)))
  leaves = {path: v for path, v in nnx.to_flat_state(abstract)}
  values: dict[tuple[str, ...], jax.Array] = {}
  start = reader.bytes_read
  for m in maps:
    target = shardings[m.path]
    target = target.get_value() if isinstance(target, nnx.Variable) else target
    leaf = leaves[m.path]
    dtype = np.dtype(leaf.dtype)
    if not m.layered:
      values[m.path] = _read_sharded(reader, m, m.hf_name, target, dtype)
      continue
    layer_sharding = NamedSharding(mesh, PartitionSpec(*target.spec[1:]))
    full = _zeros_fn(tuple(leaf.shape), dtype, target)()
    for i in range(num_layers):
      layer = _read_sharded(reader, m, m.hf_name.format(i=i), layer_sharding, dtype)
      full = _insert_fn(target)(full, layer, np.int32(i))
    values[m.path] = full
  logger.info("Read %.1f MB of %s on process %d", (reader.bytes_read - start) / 1e6,
              reader.source, jax.process_index())

  def fill(keypath, var):
    return var.replace(values[tuple(k.key for k in keypath)])

  return jax.tree_util.tree_map_with_path(
      fill, abstract, is_leaf=lambda x: isinstance(x, nnx.Variable))


def load_hf_state(path: str | os.PathLike, cfg: ModelConfig, mesh: Mesh,
                  rules: sharding_lib.Rules = sharding_lib.DEFAULT_RULES,
                  reader: st.CheckpointReader | None = None,
                  ) -> tuple[nnx.GraphDef, nnx.State]:
  """Reads a safetensors checkpoint into a state sharded on `mesh` by `rules`.

  Tensors are converted to `cfg.param_dtype` one at a time; stacked layer
  parameters are filled one layer at a time into a sharded buffer. Each
  process reads only the blocks of each tensor that its devices hold
  (`reader.bytes_read` counts them; pass a reader to look).
  """
  if reader is None:
    reader = st.CheckpointReader(path)
  check_tensors(reader, _hf_order(cfg),
                frozenset({"lm_head.weight"} if cfg.tie_word_embeddings else ()))
  graphdef, abstract = builder.abstract_model(cfg)
  return graphdef, read_params(reader, param_mappings(cfg), cfg.num_layers, abstract, mesh,
                               rules)


def load_hf_model(path: str | os.PathLike, mesh: Mesh | None = None,
                  rules: sharding_lib.Rules = sharding_lib.DEFAULT_RULES,
                  **config_overrides: Any) -> nnx.Module:
  """A sharded model (of the checkpoint's family) from a HF checkpoint directory.

  `mesh` defaults to a one-device mesh; `config_overrides` go to
  `config_from_hf` (e.g. `param_dtype="bfloat16"`, `attention_impl=...`).
  """
  if mesh is None:
    mesh = sharding_lib.make_mesh((1, 1, 1), jax.devices()[:1])
  cfg = config_from_hf(path, **config_overrides)
  builder.validate_model_on_mesh(cfg, mesh, rules)
  graphdef, state = load_hf_state(path, cfg, mesh, rules)
  return nnx.merge(graphdef, state)


# ---------------------------------------------------------------------------
# Export.


@functools.partial(jax.jit, static_argnames=("dtype",))
def _layer_slice(x: jax.Array, i: jax.Array, dtype: Any) -> jax.Array:
  return jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False).astype(dtype)


@functools.partial(jax.jit, static_argnames=("dtype",))
def _cast(x: jax.Array, dtype: Any) -> jax.Array:
  return x.astype(dtype)


def _fetch(x: jax.Array) -> np.ndarray:
  """The whole array on this host (a collective in multi-process runs)."""
  if jax.process_count() > 1 and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def copy_tokenizer_files(src_dir: str | os.PathLike, out_dir: str | os.PathLike
                         ) -> list[str]:
  """Copies the tokenizer files of `src_dir` into `out_dir`; returns names."""
  found = [n for n in TOKENIZER_FILES if os.path.isfile(os.path.join(src_dir, n))]
  if not found:
    raise FileNotFoundError(f"No tokenizer files ({', '.join(TOKENIZER_FILES)})"
                            f" in {src_dir}")
  os.makedirs(out_dir, exist_ok=True)
  for n in found:
    shutil.copyfile(os.path.join(src_dir, n), os.path.join(out_dir, n))
  return found


def save_hf_model(model: nnx.Module, out_dir: str | os.PathLike, dtype: str = "bfloat16",
                  max_shard_bytes: int = 5 * 2**30, tokenizer: Any = None) -> list[str]:
  """Writes `model` as a HF checkpoint; returns the safetensors file names.

  `tokenizer` is an optional directory whose tokenizer files are copied (a
  bare SentencePiece model is saved through its tokenizer class), or an
  object with `save_pretrained`. Every process must call this (the
  gathers are collective); only process 0 writes.
  """
  cfg = model.cfg
  hf_config = config_to_hf(cfg, dtype)  # fails early if not representable
  return write_checkpoint(model, _hf_order(cfg), hf_config, generation_config(cfg), out_dir,
                          dtype, max_shard_bytes, tokenizer)


def write_checkpoint(model: nnx.Module, order: list[tuple[str, ParamMapping, int | None]],
                     hf_config: dict[str, Any], gen_config: dict[str, Any] | None,
                     out_dir: str | os.PathLike, dtype: str = "bfloat16",
                     max_shard_bytes: int = 5 * 2**30, tokenizer: Any = None) -> list[str]:
  """Writes the tensors of `order` (from `model`'s parameters, in `dtype`) with
  `config.json`, `generation_config.json` and the tokenizer; see `save_hf_model`."""
  out_dir = os.fspath(out_dir)
  np_dtype = np.dtype(jnp.dtype(dtype))
  params = {path: var.get_value() for path, var in nnx.to_flat_state(nnx.state(model))}
  sources = {name: (m, i) for name, m, i in order}
  plans = [st.TensorPlan(name, m.hf_shape, np_dtype) for name, m, _ in order]
  shards = st.plan_shards(plans, max_shard_bytes)
  names = st.shard_file_names(len(shards))
  writer = processes.is_primary()

  def produce(plan: st.TensorPlan) -> np.ndarray:
    m, i = sources[plan.name]
    x = params[m.path]
    dev = _cast(x, np_dtype) if i is None else _layer_slice(x, np.int32(i), np_dtype)
    return m.to_hf(_fetch(dev))

  if writer:
    os.makedirs(out_dir, exist_ok=True)
  for fname, shard in zip(names, shards):
    st.write_file(os.path.join(out_dir, fname), shard, produce, write=writer)
  if not writer:
    return names
  if len(shards) > 1:
    st.write_index(out_dir, shards, names)
  files = [("config.json", hf_config)]
  if gen_config is not None:
    files.append(("generation_config.json", gen_config))
  for fname, content in files:
    with open(os.path.join(out_dir, fname), "w") as f:
      json.dump(content, f, indent=2)
      f.write("\n")
  if tokenizer is not None:
    save_tokenizer(tokenizer, out_dir)
  return names


def save_tokenizer(tokenizer: Any, out_dir: str | os.PathLike) -> None:
  """A tokenizer directory's files (or an object with `save_pretrained`) into `out_dir`."""
  if not hasattr(tokenizer, "save_pretrained") and _bare_sentencepiece(os.fspath(tokenizer)):
    # Saved through its class, the export names it (tokenizer_config.json):
    # AutoTokenizer would otherwise drop SentencePiece's dummy prefix space.
    tokenizer = load_tokenizer(tokenizer)
  if hasattr(tokenizer, "save_pretrained"):
    tokenizer.save_pretrained(out_dir)
  else:
    copy_tokenizer_files(tokenizer, out_dir)


def _bare_sentencepiece(path: str) -> bool:
  """A directory with a SentencePiece model and nothing that names its tokenizer class."""
  return os.path.isfile(os.path.join(path, "tokenizer.model")) and not any(
      os.path.isfile(os.path.join(path, n)) for n in ("tokenizer.json", "tokenizer_config.json"))


def _generic_fast_tokenizer(path: str) -> bool:
  """A `tokenizer.json` whose `tokenizer_config.json` names the generic fast class (as the
  exports here do) and no custom code."""
  try:
    with open(os.path.join(path, "tokenizer_config.json")) as f:
      tokenizer_config = json.load(f)
  except (OSError, ValueError):
    return False
  return (os.path.isfile(os.path.join(path, "tokenizer.json"))
          and tokenizer_config.get("tokenizer_class") in ("PreTrainedTokenizerFast",
                                                          "TokenizersBackend")
          and "auto_map" not in tokenizer_config)


def load_tokenizer(path: str | os.PathLike) -> Any:
  """`AutoTokenizer` from a local directory (or a hub id, passed through)."""
  import transformers
  path = os.path.expanduser(os.fspath(path))
  if os.path.isdir(path):
    if not any(os.path.isfile(os.path.join(path, n)) for n in TOKENIZER_FILES):
      raise FileNotFoundError(
          f"No tokenizer files in {path}: expected one of {TOKENIZER_FILES}."
          " Copy them from the original checkpoint (copy_tokenizer_files).")
    if _bare_sentencepiece(path):
      # A bare Llama-style SentencePiece model: AutoTokenizer cannot tell its
      # class and would drop SentencePiece's dummy prefix space.
      return transformers.LlamaTokenizer.from_pretrained(path)
    if _generic_fast_tokenizer(path):
      # What AutoTokenizer returns for this class, without importing its model-config
      # machinery (which loads PyTorch, when installed, into every CLI process).
      return transformers.PreTrainedTokenizerFast.from_pretrained(path)
  elif os.path.exists(path) or path.startswith((os.sep, ".")):
    raise FileNotFoundError(f"Tokenizer path {path} is not a directory")
  return transformers.AutoTokenizer.from_pretrained(path)
