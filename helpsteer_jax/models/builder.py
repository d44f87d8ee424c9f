"""Model construction (every family's, through the registry), abstract
shapes, sharding specs and sharded materialisation."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.models import families
from helpsteer_jax.models import lora as lora_lib
from helpsteer_jax.models.config import ModelConfig
from helpsteer_jax.models.layers import LOGICAL_AXES
from helpsteer_jax.models.lora import LoraConfig


def _is_var(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def abstract_module(make: Callable[[], nnx.Module]) -> tuple[nnx.GraphDef, nnx.State]:
  """Graph definition and shape-only state of a module (no memory used)."""
  return nnx.split(nnx.eval_shape(make))


def new_model(cfg: ModelConfig, seed: int = 0) -> nnx.Module:
  """The family's module for `cfg`, initialised on the default device (or under
  `nnx.eval_shape` / a jitted initialiser)."""
  return families.for_config(cfg).module(cfg, rngs=nnx.Rngs(seed))


def abstract_model(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
  return abstract_module(lambda: new_model(cfg))


def logical_axes_tree(state: nnx.State) -> Any:
  """A tree like `state` whose Variable values are logical axis tuples."""
  def axes(v):
    names = v.get_metadata(LOGICAL_AXES) if v.has_metadata(LOGICAL_AXES) else None
    return v.replace(tuple(names) if names else (None,) * len(v.shape))
  return jax.tree.map(axes, state, is_leaf=_is_var)


def state_specs(state: nnx.State, rules: sharding_lib.Rules) -> Any:
  """PartitionSpec per Variable, from its logical axes and the rules."""
  def spec(v):
    names = v.get_metadata(LOGICAL_AXES) if v.has_metadata(LOGICAL_AXES) else ()
    names = tuple(names) or (None,) * len(v.shape)
    return v.replace(sharding_lib.logical_to_spec(names, rules))
  return jax.tree.map(spec, state, is_leaf=_is_var)


def state_shardings(state: nnx.State, mesh: Mesh, rules: sharding_lib.Rules) -> Any:
  specs = state_specs(state, rules)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


def validate_state_sharding(state: nnx.State, mesh: Mesh, rules: sharding_lib.Rules) -> None:
  """Fails before compiling if any parameter dimension cannot be sharded."""
  checks = []
  for name, v in named_variables(state).items():
    names = v.get_metadata(LOGICAL_AXES) if v.has_metadata(LOGICAL_AXES) else ()
    checks.append(sharding_lib.ShardedArrayCheck(
        name, tuple(v.shape), tuple(names) or (None,) * len(v.shape)))
  sharding_lib.check_divisible(checks, mesh, rules)


def validate_model_on_mesh(cfg: ModelConfig, mesh: Mesh, rules: sharding_lib.Rules) -> None:
  """Fails before compiling if heads, kv heads, mlp, ... cannot be sharded."""
  validate_state_sharding(abstract_model(cfg)[1], mesh, rules)


def named_variables(state: nnx.State) -> dict[str, nnx.Variable]:
  """Variables by slash-separated path, e.g. `layers/attn/q_proj`."""
  return {jax.tree_util.keystr(path, simple=True, separator="/"): v
          for path, v in jax.tree.leaves_with_path(state, is_leaf=_is_var)}


def count_params(state: nnx.State) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(state))


def materialize(make: Callable[[], nnx.Module], mesh: Mesh,
                rules: sharding_lib.Rules) -> nnx.Module:
  """Creates a module with every parameter born sharded on `mesh`.

  The initialiser is jitted with the target shardings as outputs, so no
  device ever holds a whole parameter that is meant to be sharded.
  """
  graphdef, abstract_state = abstract_module(make)
  validate_state_sharding(abstract_state, mesh, rules)
  shardings = state_shardings(abstract_state, mesh, rules)

  def init():
    return nnx.state(make())

  with jax.set_mesh(mesh):
    lowered = jax.jit(init, out_shardings=shardings).lower()
    # Initialisation runs once; on CPU, LLVM optimisation of the many RNG
    # kernels costs more than it saves.
    options = _FAST_COMPILE if mesh.devices.flat[0].platform == "cpu" else {}
    state = lowered.compile(options)()
  return nnx.merge(graphdef, state)


_FAST_COMPILE = {"xla_backend_optimization_level": 0}


def create(cfg: ModelConfig, seed: int = 0) -> nnx.Module:
  """An unsharded model on the default device (tests, small tools)."""
  mesh = sharding_lib.make_mesh((1, 1, 1), jax.devices()[:1])
  return materialize(lambda: new_model(cfg, seed), mesh, sharding_lib.DEFAULT_RULES)


def init_model(cfg: ModelConfig, mesh: Mesh, rules: sharding_lib.Rules,
               seed: int = 0) -> nnx.Module:
  """A randomly initialised, sharded model of `cfg`'s family."""
  validate_model_on_mesh(cfg, mesh, rules)
  return materialize(lambda: new_model(cfg, seed), mesh, rules)


# ---------------------------------------------------------------------------
# Vocabulary growth (tokens added to the tokenizer).

# A grown vocabulary is padded to this multiple whatever the mesh, so that a run
# resumed on another mesh builds the same shapes, and the vocab axis still
# divides over tensor-parallel meshes of up to this many devices.
VOCAB_MULTIPLE = 64
_NEW_ROW_EPSILON = 1e-9  # transformers' covariance scale for added rows


def vocab_for_tokens(vocab_size: int, num_tokens: int, multiple: int = VOCAB_MULTIPLE) -> int:
  """`vocab_size`, or `num_tokens` rounded up to `multiple` when the table is too small."""
  if num_tokens <= vocab_size:
    return vocab_size
  return -(-num_tokens // multiple) * multiple


def _with_new_rows(table: jax.Array, key: jax.Array, *, vocab_size: int, first_new: int,
                   end_new: int) -> jax.Array:
  """table [V, D] -> [vocab_size, D]: rows `first_new:end_new` drawn as transformers'
  `resize_token_embeddings` draws added rows, the others kept (zeros past V).

  The draws are N(mean, 1e-9 * covariance) of the rows before `first_new` (the
  base tokenizer's tokens), or that mean when the covariance is not positive
  definite.
  """
  old = table[:min(first_new, table.shape[0])].astype(jnp.float32)
  mean = old.mean(axis=0)
  centered = old - mean
  cov = centered.T @ centered / old.shape[0]
  chol = jnp.linalg.cholesky(cov) * math.sqrt(_NEW_ROW_EPSILON)
  noise = jax.random.normal(key, (end_new - first_new, table.shape[1]), jnp.float32)
  draws = jnp.where(jnp.all(jnp.isfinite(chol)), mean + noise @ chol.T, mean)
  grown = jnp.pad(table[:vocab_size], ((0, max(vocab_size - table.shape[0], 0)), (0, 0)))
  return jax.lax.dynamic_update_slice_in_dim(grown, draws.astype(table.dtype), first_new, 0)


def add_token_rows(model: nnx.Module, first_new: int, num_tokens: int, mesh: Mesh,
                   rules: sharding_lib.Rules, seed: int = 0) -> nnx.Module:
  """`model` (a decoder without adapters) with rows for the tokens `first_new` to
  `num_tokens - 1` added to its tokenizer.

  The embedding table (and an untied head) grows to `vocab_for_tokens` rows
  when it has too few. The rows of the added tokens, and every row a growth
  creates, are initialised as transformers' `resize_token_embeddings` does by
  default (`_with_new_rows`) from a key fixed by `seed`; the others keep
  their weights.
  """
  vocab = vocab_for_tokens(model.cfg.vocab_size, num_tokens)
  end_new = vocab if vocab > model.cfg.vocab_size else num_tokens
  cfg = model.cfg.replace(vocab_size=vocab)
  validate_model_on_mesh(cfg, mesh, rules)
  graphdef, abstract = abstract_model(cfg)
  shardings = nnx.to_pure_dict(state_shardings(abstract, mesh, rules))
  params = nnx.to_pure_dict(nnx.state(model))
  key = jax.random.key(seed)
  for index, (name, vocab_last) in enumerate((("embed", False), ("lm_head", True))):
    if name not in params:
      continue
    fn = functools.partial(_with_new_rows, vocab_size=vocab, first_new=first_new,
                           end_new=end_new)
    if vocab_last:  # the head is [hidden, vocab]
      fn = lambda w, k, grow=fn: grow(w.T, k).T  # noqa: E731
    with jax.set_mesh(mesh):
      params[name] = jax.jit(fn, out_shardings=shardings[name])(
          params[name], jax.random.fold_in(key, index))
  nnx.replace_by_pure_dict(abstract, params)
  return nnx.merge(graphdef, abstract)


# ---------------------------------------------------------------------------
# LoRA adapters (models/lora.py).


def with_adapters(model: nnx.Module, lora_cfg: LoraConfig, mesh: Mesh, rules: sharding_lib.Rules,
                  seed: int = 0, base_dtype: str | None = None,
                  adapters: dict | None = None) -> nnx.Module:
  """`model` with LoRA adapters on its targeted projections: fresh ones (PEFT's
  initialisation, born sharded) or `adapters` (a pure dict of `nnx.LoRAParam`
  values, e.g. read from a PEFT directory). The model's own weights are reused,
  cast to `base_dtype` when given (bf16 base weights under fp32 adapters)."""
  cfg = dataclasses.replace(model.cfg, lora=lora_cfg)
  graphdef, abstract = abstract_module(lambda: new_model(cfg, seed))
  validate_state_sharding(abstract, mesh, rules)
  _, lora_abstract, _ = nnx.split(nnx.eval_shape(lambda: new_model(cfg, seed)),
                                  nnx.LoRAParam, ...)
  shardings = nnx.to_pure_dict(state_shardings(lora_abstract, mesh, rules))
  with jax.set_mesh(mesh):
    if adapters is None:
      adapters = jax.jit(lambda: nnx.to_pure_dict(nnx.state(new_model(cfg, seed), nnx.LoRAParam)),
                         out_shardings=shardings)()
    else:
      adapters = jax.tree.map(lambda x, s: jax.device_put(jax.numpy.asarray(x, "float32"), s),
                              adapters, shardings)
  _, params, rest = nnx.split(model, nnx.Param, ...)
  params = nnx.to_pure_dict(params)
  if base_dtype:
    with jax.set_mesh(mesh):
      params = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(base_dtype), p),
                       donate_argnums=0)(params)
  return nnx.merge(graphdef, adapters, params, rest)


def adapter_params(model: nnx.Module) -> dict:
  """The model's LoRA adapters as a pure dict (empty without LoRA)."""
  return nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam))


def merge_adapters(model: nnx.Module, dtype: str | None = None) -> nnx.Module:
  """Folds every LoRA adapter into the weight it adapts (PEFT's `merge_and_unload`):
  W + (alpha / rank) A B, computed in fp32 and stored in `dtype` (default: W's),
  then drops the adapters. Changes `model` in place (its weights are new arrays;
  arrays it shares with others are not modified) and returns it."""
  for _, node in list(nnx.iter_graph(model)):
    if not isinstance(node, nnx.Module):
      continue
    for attr, value in list(vars(node).items()):
      if not isinstance(value, lora_lib.Adapter):
        continue
      weight = getattr(node, lora_lib.TARGETS[attr.removesuffix("_lora")][1])
      w = weight[...]
      merged = jax.jit(functools.partial(_merged, scale=value.scale, dtype=dtype or w.dtype),
                       out_shardings=getattr(w, "sharding", None))
      weight[...] = merged(w, value.lora_a[...], value.lora_b[...])
      setattr(node, attr, None)
    if isinstance(getattr(node, "cfg", None), ModelConfig) and node.cfg.lora is not None:
      node.cfg = dataclasses.replace(node.cfg, lora=None)
  return model


def with_dtype(model: nnx.Module, dtype: str) -> nnx.Module:
  """A copy of `model` computing in and storing its parameters in `dtype` (e.g. bf16
  rollouts of an fp32 policy); `model` is unchanged."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  cast = jax.jit(lambda tree: jax.tree.map(lambda a: a.astype(dtype), tree))
  copy = nnx.merge(graphdef, cast(params), rest)
  for _, node in nnx.iter_graph(copy):
    if isinstance(node, nnx.Module) and isinstance(getattr(node, "cfg", None), ModelConfig):
      node.cfg = dataclasses.replace(node.cfg, dtype=dtype, param_dtype=dtype)
  return copy


def _merged(w: jax.Array, a: jax.Array, b: jax.Array, *, scale: float, dtype) -> jax.Array:
  """W + scale A B for stacked layers: W [L, in..., out...], A [L, in..., r], B [L, r, out...]."""
  layers, rank = a.shape[0], a.shape[-1]
  delta = jax.numpy.einsum("lir,lro->lio", a.reshape(layers, -1, rank).astype("float32"),
                           b.reshape(layers, rank, -1).astype("float32")) * scale
  return (w.astype("float32") + delta.reshape(w.shape)).astype(dtype)
