"""The train state (params, optimizer state, step, RNG) and its shardings."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.models import builder


@dataclasses.dataclass
class TrainState:
  """Everything a resumed run needs besides the data position.

  `params` is a nested dict of arrays (the model's `nnx.Param` state as a
  pure dict, fp32 master weights); `rng` is raw key data so it checkpoints.
  """

  step: jax.Array
  params: dict
  opt_state: Any
  rng: jax.Array


jax.tree_util.register_dataclass(
    TrainState, data_fields=["step", "params", "opt_state", "rng"], meta_fields=[])


@dataclasses.dataclass
class ModelParts:
  """A model split into its static graph, its trainable params, its frozen weights
  (the base under LoRA adapters; empty otherwise) and the rest.

  The frozen weights are an argument of every jitted step (never a constant
  baked into the program) and are not part of the train state: checkpoints
  and optimizer state hold the trainable params only.
  """

  graphdef: nnx.GraphDef
  params: dict
  rest: nnx.State  # non-trainable state (empty for the decoder)
  param_shardings: dict
  base: dict = dataclasses.field(default_factory=dict)
  base_shardings: dict = dataclasses.field(default_factory=dict)


def has_adapters(module: nnx.Module) -> bool:
  return bool(jax.tree.leaves(nnx.state(module, nnx.LoRAParam)))


def split_model(module: nnx.Module, mesh: Mesh, rules: sharding_lib.Rules,
                trainable: Any = None) -> ModelParts:
  """Trainable params (`trainable`, an nnx filter; default: every `nnx.Param`, or with
  LoRA adapters the adapters and the submodules the model trains whole beside them,
  its `trained_with_adapters` names, e.g. the attribute model's head), frozen base
  weights, the rest."""
  if trainable is None and has_adapters(module):
    whole = [nnx.PathContains(name) for name in getattr(module, "trained_with_adapters", ())]
    trainable = nnx.Any(nnx.LoRAParam, *whole)
  elif trainable is None:
    trainable = nnx.Param
  graphdef, params, base, rest = nnx.split(module, trainable, nnx.Param, ...)
  shardings = builder.state_shardings(params, mesh, rules)
  base_shardings = builder.state_shardings(base, mesh, rules)
  return ModelParts(graphdef, nnx.to_pure_dict(params), rest, nnx.to_pure_dict(shardings),
                    nnx.to_pure_dict(base), nnx.to_pure_dict(base_shardings))


def merge_model(parts: ModelParts, params: dict, base: dict | None = None) -> nnx.Module:
  """The model of `params` (and `base`: the frozen weights; inside a jitted function
  pass its traced argument, outside `parts.base` is used)."""
  return nnx.merge(parts.graphdef, params, parts.base if base is None else base, parts.rest)


def _opt_state_shardings(tx: optax.GradientTransformation, params: dict,
                         param_shardings: dict, mesh: Mesh) -> Any:
  """Moments follow their parameter's sharding; counts are replicated."""
  replicated = NamedSharding(mesh, PartitionSpec())
  abstract = jax.eval_shape(tx.init, params)
  return optax.tree_map_params(tx, lambda _, s: s, abstract, param_shardings,
                               transform_non_params=lambda _: replicated)


def state_shardings(tx: optax.GradientTransformation, parts: ModelParts, mesh: Mesh) -> TrainState:
  replicated = NamedSharding(mesh, PartitionSpec())
  return TrainState(
      step=replicated, params=parts.param_shardings,
      opt_state=_opt_state_shardings(tx, parts.params, parts.param_shardings, mesh),
      rng=replicated)


def create_train_state(tx: optax.GradientTransformation, parts: ModelParts, mesh: Mesh,
                       seed: int) -> tuple[TrainState, TrainState]:
  """A fresh state, laid out on the mesh, and the matching shardings tree."""
  shardings = state_shardings(tx, parts, mesh)

  def init(params):
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params),
                      rng=jax.random.key_data(jax.random.key(seed)))

  with jax.set_mesh(mesh):
    state = jax.jit(init, in_shardings=(parts.param_shardings,), out_shardings=shardings,
                    donate_argnums=0)(parts.params)
  return state, shardings


def abstract_train_state(tx: optax.GradientTransformation, parts: ModelParts,
                         mesh: Mesh) -> tuple[TrainState, TrainState]:
  """Shapes, dtypes and shardings of a fresh state, without allocating it.

  `parts.params` may itself be abstract (from `nnx.eval_shape`): this is how
  a step is compiled ahead of time for hardware that is not attached.
  """
  shardings = state_shardings(tx, parts, mesh)
  shapes = jax.eval_shape(lambda p: TrainState(
      step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p),
      rng=jax.random.key_data(jax.random.key(0))), parts.params)
  return sharding_lib.abstract_arrays(shapes, shardings), shardings
