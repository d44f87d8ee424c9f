"""One-step-off-policy rollouts: iteration t+1's rollouts sampled on their own devices
while iteration t's update runs (`rollout.max_staleness=1`).

The run's devices are split in two sets (`split_devices`): the training mesh
(`config.mesh`, the policy's train state, the reference, the scorer, the
critic, the teacher) and the rollout mesh (`rollout.mesh`: the engine and a
copy of the policy's weights). Iteration t:

1. takes its rollouts: those sampled during iteration t-1 with the weights
   W_{t-1} (restored from the checkpoint after a restart), or, on a run's first
   iteration, sampled now with W_t;
2. starts sampling iteration t+1's with the rollout side's weights W_t on a
   worker thread, then the behaviour policy's log-probabilities of them on the
   training path's code (`objective.completion_logprobs`, the policy's dtype)
   with the same weights, for the loss's ratio;
3. scores its rollouts, computes the reference's log-probs and updates the
   policy on the training mesh, W_t -> W_{t+1};
4. waits for the worker and copies W_{t+1} to the rollout mesh (`load`).

Each device set is driven by one thread (the training mesh by the loop's, the
rollout mesh by the worker while a batch is being sampled, else by the loop's),
so every process issues each set's programs in the same order. The batch
sampled ahead is kept on the host and checkpointed with the running reward
moments (`state` / `restore`), so a resumed run trains on the rollouts an
uninterrupted one would.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import io
import time
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from helpsteer_jax import frozen_pass, runtime
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference.engine import Engine
from helpsteer_jax.models import builder
from helpsteer_jax.rl import objective, rollout


def split_devices(rollout_devices: int, devices: Sequence[Any] | None = None
                  ) -> tuple[list, list]:
  """(training devices, rollout devices) of `devices` (default: every process's): each
  process gives its last `rollout_devices / process_count` local devices to rollouts, so
  both meshes span every process (0: half of them)."""
  devices = list(jax.devices() if devices is None else devices)
  by_process: dict[int, list] = {}
  for d in devices:
    by_process.setdefault(d.process_index, []).append(d)
  processes = len(by_process)
  n = rollout_devices or len(devices) // 2
  local = min(len(v) for v in by_process.values())
  if n % processes or not 0 < n // processes < local:
    raise ConfigError(
        f"rollout.devices={rollout_devices}: {len(devices)} devices on {processes}"
        f" process(es), {local} each; the rollout devices must be a multiple of {processes}"
        f" leaving each process at least one training device (or 0: half of them), and"
        f" max_staleness=1 needs at least two devices per process")
  per = n // processes
  train, roll = [], []
  for p in sorted(by_process):
    own = by_process[p]
    train += own[:len(own) - per]
    roll += own[len(own) - per:]
  return train, roll


def rollout_runtime(config: ml_collections.ConfigDict, rt: runtime.Runtime,
                    devices: Sequence[Any]) -> runtime.Runtime:
  """The rollout side's mesh (`rollout.mesh` over `devices`) with the run's rules."""
  m = config.rollout.mesh
  try:
    return runtime.Runtime(sharding_lib.make_mesh((m.data, m.fsdp, m.tensor), devices),
                           rt.rules)
  except sharding_lib.ShardingConfigError as e:
    raise ConfigError(f"rollout.mesh over the {len(devices)} rollout devices: {e}") from None


def mirror_mesh(mesh: Mesh, source: Sequence[Any]) -> Mesh:
  """`mesh`'s shape and axes over the `source` devices, each in the place of the device
  of its own process with the same local rank (as many of each on every process)."""
  pair, by_process = {}, {}
  for d in source:
    by_process.setdefault(d.process_index, []).append(d)
  for d in mesh.devices.flat:
    own = by_process.get(d.process_index)
    if not own:
      raise ConfigError("rollout.devices: with several processes each process needs as many"
                        " training devices as rollout devices (rollout.devices=0: half)")
    pair[d.id] = own.pop(0)
  grid = np.vectorize(lambda d: pair[d.id], otypes=[object])(mesh.devices)
  return Mesh(grid, mesh.axis_names, axis_types=mesh.axis_types)


def to_mesh(model: nnx.Module, mesh: Mesh, rules: sharding_lib.Rules,
            source: Sequence[Any] = ()) -> nnx.Module:
  """A copy of `model` with its arrays laid out on `mesh` by their logical axes.

  With several processes JAX moves arrays between device sets only on TPU's runtime: the
  arrays are resharded on their own devices (`source`) into `mesh`'s layout
  (`mirror_mesh`), then each shard is copied to the device of its process that takes its
  place."""
  graphdef, state = nnx.split(model)
  target = builder.state_shardings(state, mesh, rules)
  if jax.process_count() == 1:
    return nnx.merge(graphdef, jax.device_put(state, target))
  mirror = mirror_mesh(mesh, source)
  pair = {m.id: d for m, d in zip(mirror.devices.flat, mesh.devices.flat)}
  staged = jax.jit(lambda x: x, out_shardings=jax.tree.map(
      lambda s: NamedSharding(mirror, s.spec), target))(state)

  def copy(x: jax.Array, sharding: NamedSharding) -> jax.Array:
    shards = [jax.device_put(s.data, pair[s.device.id]) for s in x.addressable_shards]
    return jax.make_array_from_single_device_arrays(x.shape, sharding, shards)

  return nnx.merge(graphdef, jax.tree.map(copy, staged, target))


@dataclasses.dataclass
class Sampled:
  """One iteration's rollouts, the behaviour policy's [R, T] log-probs of them on the
  training path (0 on padding), the iteration whose starting weights sampled them
  (`version`) and the seconds their sampling took."""

  iteration: int
  version: int
  rollouts: rollout.Rollouts
  behaviour_logp: np.ndarray
  seconds: float

  def metrics(self, iteration: int) -> dict[str, float]:
    """Updates since the weights that sampled them."""
    return {"staleness": float(iteration - self.version)}


_ARRAYS = ("tokens", "mask", "sampler_logp", "finished")


def _encode(b: Sampled) -> dict:
  buf = io.BytesIO()
  r = b.rollouts
  np.savez(buf, behaviour_logp=b.behaviour_logp, **{k: getattr(r, k) for k in _ARRAYS})
  return {"iteration": b.iteration, "version": b.version, "seconds": b.seconds, "k": r.k,
          "prompts": r.prompts, "texts": r.texts,
          "arrays": base64.b64encode(buf.getvalue()).decode()}


def _decode(d: dict) -> Sampled:
  arrays = np.load(io.BytesIO(base64.b64decode(d["arrays"])))
  r = rollout.Rollouts(d["prompts"], int(d["k"]), *(arrays[k] for k in _ARRAYS), d["texts"])
  return Sampled(int(d["iteration"]), int(d["version"]), r, arrays["behaviour_logp"],
                 float(d["seconds"]))


class OffPolicyRollouts:
  """The rollout side: its mesh, the policy's weights there, the engine, the worker.
  `source`: the training mesh's devices, where the weights come from.

  `make_engine(model)` builds the engine on the rollout mesh; `sample(engine, prompts,
  iteration)` draws an iteration's `rollout.Rollouts` with it.
  """

  def __init__(self, rt: runtime.Runtime, source: Sequence[Any],
               make_engine: Callable[[nnx.Module], Engine],
               sample: Callable[[Engine, list[list[int]], int], rollout.Rollouts], *,
               dtype: str, seq_len: int, micro_batch: int, chunk_size: int,
               temperature: float, pad_id: int):
    self.rt, self._make_engine, self._sample, self.dtype = rt, make_engine, sample, dtype
    self.source = list(source)
    self.seq_len, self.pad_id = seq_len, pad_id
    self.engine: Engine | None = None
    self.model: nnx.Module | None = None
    self.ahead: Sampled | None = None
    self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollouts")
    self._future: concurrent.futures.Future | None = None
    # Across processes the iteration's host gathers (`multihost`: the scorer's shares)
    # run programs on every device, rollout devices included; from two threads their
    # order against the worker's programs could differ between processes and deadlock.
    # So there the batch ahead is sampled in `finish`, still with the weights before the
    # update: the same batch, without the overlap.
    self._overlap = jax.process_count() == 1
    self._deferred: tuple | None = None
    rows = NamedSharding(rt.mesh, sharding_lib.batch_spec(rt.rules))
    rules = rt.rules

    def logprobs(state, batch):
      with sharding_lib.axis_rules(rules):
        return {"logp": objective.completion_logprobs(nnx.merge(self._graphdef, state), batch,
                                                      chunk_size, temperature)}

    self._logprobs = frozen_pass.FrozenPass(logprobs, rt.mesh, rows, micro_batch)

  def load(self, model: nnx.Module) -> None:
    """Copies the policy `model` (adapters merged, on the training mesh) to the rollout
    mesh; the engine decodes with it from now on. Not while a batch is being sampled."""
    if self._future is not None:
      raise RuntimeError("load while rollouts are being sampled: call finish first")
    self.model = to_mesh(model, self.rt.mesh, self.rt.rules, self.source)
    self._graphdef, self._state = nnx.split(self.model)
    cast = self.model
    if self.dtype and (model.cfg.dtype, model.cfg.param_dtype) != (self.dtype, self.dtype):
      cast = builder.with_dtype(self.model, self.dtype)
    if self.engine is None:
      self.engine = self._make_engine(cast)
    else:
      self.engine.load_weights(cast)

  def _run(self, iteration: int, version: int, prompts: list[list[int]]) -> Sampled:
    t = time.perf_counter()
    r = self._sample(self.engine, prompts, iteration)
    seconds = time.perf_counter() - t
    rows = objective.pack(r, self.seq_len, self.pad_id)
    fields = ("inputs", "targets", "positions", "segment_ids", "at")
    logp = self._logprobs((self._state,), {k: rows[k] for k in fields})
    return Sampled(iteration, version, r, np.asarray(logp["logp"]) * r.mask, seconds)

  def advance(self, iteration: int, prompts: list[list[int]], later: list[list[int]]
              ) -> Sampled:
    """`iteration`'s rollouts of `prompts` (the batch sampled ahead for it, else sampled
    now with the current weights), after starting the next iteration's, of `later`,
    on the worker (none when `later` is empty)."""
    if self.ahead is not None and self.ahead.iteration == iteration:
      batch, self.ahead = self.ahead, None
    else:
      batch = self._run(iteration, iteration, prompts)
    if later and self._overlap:
      self._future = self._worker.submit(self._run, iteration + 1, iteration, later)
    elif later:
      self._deferred = (iteration + 1, iteration, later)
    return batch

  def finish(self) -> float:
    """Waits for the batch `advance` started, or samples it now across processes (kept for
    its iteration); the seconds waited."""
    t = time.perf_counter()
    if self._deferred is not None:
      self.ahead, self._deferred = self._run(*self._deferred), None
    elif self._future is not None:
      self.ahead, self._future = self._future.result(), None
    else:
      return 0.0
    return time.perf_counter() - t

  def state(self) -> dict | None:
    """The batch sampled ahead, for the checkpoint (None: none)."""
    return None if self.ahead is None else _encode(self.ahead)

  def restore(self, state: dict | None) -> None:
    self.ahead = None if state is None else _decode(state)

  def close(self) -> None:
    self._worker.shutdown(wait=True)
