"""A task's train step on abstract inputs: what ahead-of-time compiles.

A task that supports compile-only runs exposes

    def abstract_train_step(config, rt) -> StepSpec

built with `trainer_step_spec` from three things it already has: a factory
for its module (evaluated abstractly with `nnx.eval_shape`, so no weights
are read or allocated), its `loss_fn`, and its batch schema
(`data.batches`; `BatchSchema.row_fields` gives one row's field shapes).
The step is exactly `Trainer`'s (`loop.make_train_step`, same shardings,
same donation), so what compiles here is what trains.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import ml_collections
from flax import nnx

from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.models import builder
from helpsteer_jax.runtime import Runtime
from helpsteer_jax.train import loop, optim
from helpsteer_jax.train import state as state_lib

# field name -> (shape of one row without the batch dims, dtype): BatchSchema.row_fields
BatchFields = Mapping[str, tuple[tuple[int, ...], Any]]


@dataclasses.dataclass
class StepSpec:
  """A jitted train step and abstract arguments carrying their shardings."""

  step: Callable
  args: tuple
  rt: Runtime
  tokens_per_step: int
  analytic_flops_per_step: float
  num_params: int
  # bytes per device of what the run keeps resident beside the step, by holder
  resident_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
  # Per-device bytes on devices apart from the step's (RL's rollout side), by holder
  rollout_bytes: dict[str, int] = dataclasses.field(default_factory=dict)

  def lower(self) -> jax.stages.Lowered:
    with jax.set_mesh(self.rt.mesh):
      return self.step.lower(*self.args)


def trainer_step_spec(config: ml_collections.ConfigDict, rt: Runtime,
                      make_module: Callable[[], nnx.Module], loss_fn: loop.LossFn,
                      fields: BatchFields, flops_per_token: float,
                      tokens_per_row: int | None = None,
                      frozen_params: bool = False,
                      resident: Callable[[state_lib.ModelParts, Any], Any] | None = None
                      ) -> StepSpec:
  """The step `Trainer` would run for `config`, on shapes only.

  `frozen_params`: the loss also takes a frozen copy of the parameters (a
  reference model run in the step), passed with the parameters' shardings.
  `resident(parts, tx)`: abstract arrays (with shardings) that the run keeps in
  device memory beside the step; passed as a last argument the step does not
  read, so that the memory report counts them.
  """
  tc = config.train
  loop.check_batch_config(tc, rt)
  module = nnx.eval_shape(make_module)
  builder.validate_state_sharding(nnx.state(module, nnx.Param), rt.mesh, rt.rules)
  parts = state_lib.split_model(module, rt.mesh, rt.rules)
  base_dtype = config.model.lora.base_dtype if "lora" in config.model else ""
  if parts.base and base_dtype:  # as runtime.attach_adapters stores them
    parts.base = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, base_dtype), parts.base)
  tx, schedule = optim.make_optimizer(config.optimizer, tc.num_steps)
  state, shardings = state_lib.abstract_train_state(tx, parts, rt.mesh)
  accum = tc.global_batch // tc.micro_batch
  batch_sharding = loop.step_batch_sharding(rt)
  batch = {k: jax.ShapeDtypeStruct((accum, tc.micro_batch) + tuple(shape), dtype,
                                   sharding=batch_sharding)
           for k, (shape, dtype) in fields.items()}
  train_step = loop.make_train_step(parts, loss_fn, tx, schedule, rt.rules, accum)
  args: tuple = (state, batch, sharding_lib.abstract_arrays(parts.base, parts.base_shardings))
  frozen_shardings: tuple = (parts.base_shardings,)
  if frozen_params:
    frozen_shardings += (parts.param_shardings,)
    args += (sharding_lib.abstract_arrays(parts.params, parts.param_shardings),)
  if resident is not None:
    held = resident(parts, tx)
    frozen_shardings += (jax.tree.map(lambda a: a.sharding, held),)
    args += (held,)
    inner = train_step

    def train_step(state, batch, *rest):
      return inner(state, batch, *rest[:-1])

  step = loop.jit_train_step(train_step, rt, shardings, batch_sharding, frozen_shardings,
                             keep_unused=resident is not None)
  tokens = tc.global_batch * (tokens_per_row or tc.seq_len)
  num_params = builder.count_params(nnx.state(module, nnx.Param))
  return StepSpec(step, args, rt, tokens, flops_per_token * tokens, num_params)
