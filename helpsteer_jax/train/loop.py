"""The training loop shared by every task.

A task supplies `loss_fn(model, batch) -> (loss_sum, sums)`: the summed loss
of a micro-batch and summed metrics, with `sums["weight"]` the normaliser
(loss tokens for SFT, pairs for DPO, ...). The loop owns everything else:
one jitted step with explicit shardings and a donated state, gradient
accumulation over micro-batches inside the step (`lax.scan`), the global
normalisation (sum over micro-batches / total weight, so accumulation does
not change the result) and evaluation; `train.run_loop` runs the steps with
checkpoints, preemption, logging and the eval cadence.

`frozen` (optional): a tree of arrays the loss needs but does not train
(e.g. a reference model's parameters), passed to the jitted step as an
argument with its shardings and to the loss as `loss_fn(model, batch, frozen)`.
"""

from __future__ import annotations

import pathlib
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from helpsteer_jax import runtime, unrollable
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.data import pipeline
from helpsteer_jax.errors import ConfigError, TrainingError
from helpsteer_jax.models import lora
from helpsteer_jax.runtime import Runtime
from helpsteer_jax.train import base_fingerprint, optim, run_loop
from helpsteer_jax.train import checkpoint as ckpt_lib
from helpsteer_jax.train import metrics as metrics_lib
from helpsteer_jax.train import state as state_lib
from helpsteer_jax.train.run_loop import RunResult

LossFn = Callable[[nnx.Module, dict[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]]


def _tree_zeros_like(tree):
  return jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree)


def check_batch_config(tc: ml_collections.ConfigDict, rt: Runtime) -> None:
  """Fails before compiling when the batch sizes cannot be split or sharded."""
  if tc.global_batch % tc.micro_batch:
    raise ConfigError(f"train.global_batch={tc.global_batch} must be a multiple of"
                      f" train.micro_batch={tc.micro_batch}")
  sharding_lib.check_batch(tc.micro_batch, rt.mesh, rt.rules, "train.micro_batch")
  if tc.loss_chunk_size > 0 and tc.seq_len % tc.loss_chunk_size and tc.seq_len > tc.loss_chunk_size:
    raise ConfigError(f"train.seq_len={tc.seq_len} must be a multiple of"
                      f" train.loss_chunk_size={tc.loss_chunk_size}")


def pipeline_config(config: ml_collections.ConfigDict, rows: int) -> pipeline.PipelineConfig:
  """How `Trainer` batches a task's examples into rows of `train.seq_len`."""
  return pipeline.PipelineConfig(seq_len=config.train.seq_len, rows=rows,
                                 packing=config.data.packing, seed=config.seed,
                                 fixed_shape=config.data.get("fixed_shape", False))


def step_batch_sharding(rt: Runtime) -> NamedSharding:
  """Sharding of a step's batch arrays [micro_batches, batch, length, ...]."""
  return NamedSharding(rt.mesh, PartitionSpec(None, *sharding_lib.batch_spec(rt.rules)))


def make_train_step(parts: state_lib.ModelParts, loss_fn: LossFn,
                    tx: optax.GradientTransformation, schedule: Callable,
                    rules: sharding_lib.Rules, accum: int) -> Callable:
  """`train_step(state, batch, base, *frozen) -> (state, metrics)`; batch leaves are
  [accum, micro, ...], `base` the model's frozen weights (`parts.base`)."""

  def micro_loss(params, batch, base, key, *frozen):
    with lora.dropout_key(key):  # LoRA dropout, when configured, in training steps only
      return loss_fn(state_lib.merge_model(parts, params, base), batch, *frozen)

  def train_step(state: state_lib.TrainState, batch: dict[str, jax.Array], base, *frozen):
    step_key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    with sharding_lib.axis_rules(rules):
      def accumulate(carry, xs):
        grads, sums = carry
        micro, i = xs
        (loss, aux), g = jax.value_and_grad(micro_loss, has_aux=True)(
            state.params, micro, base, jax.random.fold_in(step_key, i), *frozen)
        aux = {"loss": loss, **aux}
        grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
        return (grads, jax.tree.map(jnp.add, sums, aux)), None

      if accum == 1:  # no accumulation buffers: the gradient is the step's gradient
        (loss, aux), grads = jax.value_and_grad(micro_loss, has_aux=True)(
            state.params, jax.tree.map(lambda x: x[0], batch), base,
            jax.random.fold_in(step_key, 0), *frozen)
        sums = {"loss": loss, **aux}
      else:
        first = jax.tree.map(lambda x: x[0], batch)
        zero_sums = jax.tree.map(
            lambda x: jnp.zeros((), jnp.float32),
            jax.eval_shape(lambda: micro_loss(state.params, first, base, step_key, *frozen)[1]))
        zero_sums = {"loss": jnp.zeros((), jnp.float32), **zero_sums}
        (grads, sums), _ = unrollable.scan(
            accumulate, (_tree_zeros_like(state.params), zero_sums),
            (batch, jnp.arange(accum, dtype=jnp.int32)))
      # A non-finite loss poisons the gradient too, so the update is skipped
      # (`tx` is wrapped in optim.apply_if_finite, see optim.make_optimizer).
      denom = jnp.maximum(sums["weight"], 1.0)
      with jax.named_scope("optimizer_update"):
        scale = jnp.where(jnp.isfinite(sums["loss"]), 1.0 / denom, jnp.nan)
        grads = jax.tree.map(lambda g: g * scale, grads)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
      metrics = {k: v / denom for k, v in sums.items() if k != "weight"}
      metrics.update(grad_norm=grad_norm, learning_rate=schedule(state.step),
                     weight=sums["weight"], nonfinite_run=opt_state.notfinite_count,
                     nonfinite_total=opt_state.total_notfinite)
      new_state = state_lib.TrainState(step=state.step + 1, params=params,
                                       opt_state=opt_state, rng=state.rng)
      return new_state, metrics

  return train_step


def global_array(batch: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """The global array of a host array every process holds whole; each process transfers
  only its devices' shards."""
  return jax.make_array_from_callback(batch.shape, sharding, lambda index: batch[index])


def jit_train_step(train_step: Callable, rt: Runtime, state_shardings: state_lib.TrainState,
                   batch_sharding: NamedSharding, frozen_shardings: tuple = (),
                   keep_unused: bool = False) -> Callable:
  """The jitted step: explicit shardings, the state donated. `frozen_shardings`
  are those of the arguments after the batch (the base weights first); `keep_unused`
  keeps arguments the step does not read (compile-only memory reports)."""
  with jax.set_mesh(rt.mesh):
    return jax.jit(train_step, in_shardings=(state_shardings, batch_sharding, *frozen_shardings),
                   out_shardings=(state_shardings, None), donate_argnums=(0,),
                   keep_unused=keep_unused)


def check_finite(step: int, fetched: dict[str, float], limit: int) -> None:
  """Aborts after `limit` (`train.max_consecutive_nonfinite`) skipped updates in a row;
  `fetched` holds a step's `nonfinite_run` and `nonfinite_total` metrics."""
  run = int(fetched["nonfinite_run"])
  if run:
    logging.warning("step %d: %d update(s) in a row skipped for a non-finite loss or"
                    " gradient (%d in this run so far)", step, run,
                    int(fetched["nonfinite_total"]))
  if limit and run >= limit:
    first = step - run + 1
    raise TrainingError(
        f"the loss or gradients were non-finite for {run} consecutive steps ({first}..{step},"
        f" global batches {first - 1}..{step - 1} counting from 0 in the training stream);"
        " every update was skipped. Lower optimizer.lr, raise optimizer.warmup_steps or"
        " check those batches' data; train.max_consecutive_nonfinite sets the limit")


class Trainer:
  """Builds the jitted step and runs it with logging, eval and checkpoints."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
               rt: Runtime, parts: state_lib.ModelParts, loss_fn: LossFn,
               train_features: Sequence[dict], eval_features: Sequence[dict] = (),
               flops_per_token: float = 0.0, export_fn: Callable | None = None,
               frozen: tuple[Any, Any] | None = None):
    self.config, self.rt, self.parts, self.loss_fn = config, rt, parts, loss_fn
    # After the batch, every step takes the frozen base weights, then the loss's extras.
    self.frozen = (parts.base,) + (() if frozen is None else (frozen[0],))
    self._frozen_shardings = (parts.base_shardings,) + (() if frozen is None else (frozen[1],))
    self.workdir = pathlib.Path(workdir)
    self.tc = config.train
    self.flops_per_token = flops_per_token
    self.export_fn = export_fn
    check_batch_config(self.tc, rt)
    self.accum = self.tc.global_batch // self.tc.micro_batch
    self.tx, self.schedule = optim.make_optimizer(config.optimizer, self.tc.num_steps)

    # Every process builds the same global batch and feeds its devices' rows.
    self.train_data = pipeline.training_dataset(train_features,
                                                pipeline_config(config, self.tc.global_batch))
    self.train_iter = iter(self.train_data)
    self.eval_features = list(eval_features)

    self.batch_sharding = step_batch_sharding(rt)
    self.eval_batch_sharding = NamedSharding(rt.mesh, sharding_lib.batch_spec(rt.rules))
    best = run_loop.best_metric(self.tc)
    if best is not None:
      run_loop.check_reported(best, self._eval_metric_names() if self.eval_features else (),
                              "" if self.eval_features else "set data.validation_path")
    self.checkpointer = ckpt_lib.Checkpointer(
        self.workdir / "checkpoints", self.tc.save_every, self.tc.keep_checkpoints,
        async_save=self.tc.async_checkpoint, best=best)
    self.state, self.state_shardings = self._initial_state()
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.state))
    runtime.check_free_space(self.workdir, state_bytes, "one checkpoint of the train state")
    self._compile()

  # -- setup ---------------------------------------------------------------

  def _initial_state(self) -> tuple[state_lib.TrainState, state_lib.TrainState]:
    state, shardings = state_lib.create_train_state(self.tx, self.parts, self.rt.mesh,
                                                    self.config.seed)
    resuming = self.checkpointer.latest_step() is not None
    base_fingerprint.check_or_record(self.checkpointer.directory, self.parts.base, resuming)
    restored = self.checkpointer.restore_latest(sharding_lib.abstract_arrays(state, shardings),
                                                self.train_iter)
    if restored is not None:
      state = restored
      logging.info("resuming at step %d", int(state.step))
    return state, shardings

  def _eval_sums(self, params, batch, base, *frozen) -> dict[str, jax.Array]:
    """The eval step: a batch's summed loss and metrics (`weight` the normaliser)."""
    with sharding_lib.axis_rules(self.rt.rules):
      loss, aux = self.loss_fn(state_lib.merge_model(self.parts, params, base), batch, *frozen)
      return {"loss": loss, **aux}

  def _eval_metric_names(self) -> list[str]:
    """What `evaluate` reports, from the eval step traced on the first eval batch."""
    batch = next(iter(pipeline.evaluation_batches(
        self.eval_features, pipeline_config(self.config, self.tc.micro_batch))))
    with jax.set_mesh(self.rt.mesh):
      sums = jax.eval_shape(self._eval_sums, self.parts.params, batch, *self.frozen)
    return [name for name in sums if name != "weight"]

  def _compile(self) -> None:
    parts, loss_fn, rules = self.parts, self.loss_fn, self.rt.rules
    train_step = make_train_step(parts, loss_fn, self.tx, self.schedule, rules, self.accum)
    self.train_step = jit_train_step(train_step, self.rt, self.state_shardings, self.batch_sharding,
                                     self._frozen_shardings)
    with jax.set_mesh(self.rt.mesh):
      self.eval_step = jax.jit(self._eval_sums, in_shardings=(self.state_shardings.params,
                                                              self.eval_batch_sharding,
                                                              *self._frozen_shardings))

  # -- data ------------------------------------------------------------------

  def _next_batch(self) -> tuple[dict[str, jax.Array], int]:
    batch = next(self.train_iter)
    tokens = int(np.sum(batch["segment_ids"] > 0))
    stacked = {k: v.reshape((self.accum, self.tc.micro_batch) + v.shape[1:])
               for k, v in batch.items()}
    return {k: global_array(v, self.batch_sharding) for k, v in stacked.items()}, tokens

  # -- evaluation ------------------------------------------------------------

  def evaluate(self) -> dict[str, float]:
    if not self.eval_features:
      return {}
    cfg = pipeline_config(self.config, self.tc.micro_batch)
    totals: dict[str, float] = {}
    for i, batch in enumerate(pipeline.evaluation_batches(self.eval_features, cfg)):
      if self.tc.eval_batches and i >= self.tc.eval_batches:
        break
      with jax.set_mesh(self.rt.mesh):
        sums = self.eval_step(self.state.params, {k: global_array(v, self.eval_batch_sharding)
                                                  for k, v in batch.items()}, *self.frozen)
      for k, v in jax.device_get(sums).items():
        totals[k] = totals.get(k, 0.0) + float(v)
    weight = max(totals.get("weight", 0.0), 1.0)
    return {k: v / weight for k, v in totals.items() if k != "weight"}

  # -- the loop --------------------------------------------------------------

  def run(self, stop_at: int | None = None) -> RunResult:
    """Trains to `train.num_steps` (or `stop_at`), resuming where a run stopped."""
    tc = self.tc
    peak = (metrics_lib.peak_flops_per_device(tc.peak_flops, tc.cpu_peak_gflops * 1e9)
            * jax.device_count())
    window = {"tokens": 0, "steps": 0, "start": time.perf_counter()}
    pending = None

    def step(_: int) -> None:
      nonlocal pending
      batch, tokens = self._next_batch()
      with jax.set_mesh(self.rt.mesh):
        self.state, pending = self.train_step(self.state, batch, *self.frozen)
      window["tokens"] += tokens
      window["steps"] += 1

    def logged(step: int, force: bool):
      if step % tc.log_every and not force:
        return None
      fetched = {k: float(v) for k, v in jax.device_get(pending).items()}
      check_finite(step, fetched, tc.max_consecutive_nonfinite)
      elapsed = time.perf_counter() - window["start"]
      tps, steps = window["tokens"] / max(elapsed, 1e-9), window["steps"]
      fetched.update(tokens_per_s=tps, step_time=elapsed / steps,
                     fill=window["tokens"] / (steps * tc.global_batch * tc.seq_len))
      if peak and self.flops_per_token:
        fetched["mfu"] = self.flops_per_token * tps / peak
      window.update(tokens=0, steps=0, start=time.perf_counter())
      return fetched, steps, {"loss": f"{fetched['loss']:.4f}", "tok_s": f"{tps:.0f}"}

    hooks = run_loop.Hooks(
        step=step, logged=logged,
        save=lambda i, preempted, evals: self.checkpointer.save(
            i, self.state, self.train_iter, preempted=preempted, metrics=evals),
        save_final=lambda i, evals: self.checkpointer.save_final(i, self.state, self.train_iter,
                                                                 metrics=evals),
        wait=self.checkpointer.wait, evaluate=lambda _: self.evaluate(),
        export=(None if self.export_fn is None
                else lambda i: self.export_fn(self.params_at(i))),
        best=self.checkpointer.best)
    return run_loop.run_steps(self.config, self.workdir, int(jax.device_get(self.state.step)),
                              hooks, stop_at)

  def params_at(self, step: int | None) -> dict:
    """The trained params of the current state (`step` None) or of checkpoint `step`
    (e.g. `RunResult.exported.step`)."""
    return self.checkpointer.params_at(step, int(jax.device_get(self.state.step)),
                                       self.state.params, self.state_shardings.params)

  def close(self) -> None:
    self.checkpointer.close()
