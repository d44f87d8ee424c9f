"""What an RL iteration keeps in device memory beside the policy's train state.

Compile-only runs (`tasks.rl.abstract_train_step`) pass these as unused
arguments of the policy's update step, so XLA's per-device memory report
counts them with the shardings the run gives them:

- `engine`: the decoding engine's per-layer copy of the policy's layers
  (under LoRA the merged weights, at the base's dtype; with `rollout.dtype`, a
  copy of every weight in that dtype), and its KV cache of `rollout.max_batch`
  rows of `train.seq_len` tokens in the compute dtype (or `rollout.dtype`);
- `reference`: a frozen copy of the starting weights, when the KL needs one
  and there are no LoRA adapters to switch off;
- `attribute_model`: the scorer's weights (`config.scorer.model`) when it
  runs on the mesh (not the demo rules, a URL or a factory);
- `judge`: a generative judge's causal LM on the mesh (`scorer.judge` set with a path as
  the source, or `scorer.principle_source` a path; `config.scorer.model`'s shapes), and
  when it decodes (a GenRM always, a principle judge when it reasons first,
  `scorer.judge_max_new_tokens` > 0) its engine's per-layer copy of the layers and a KV
  cache of `scorer.batch_size` rows of `scorer.max_len` tokens;
- `critic`: PPO's value model's train state (its own Adam moments).

With `rollout.max_staleness=1` the engine is on the rollout devices instead, beside
the copy of the policy's weights the behaviour log-probs read (`rollout_arrays`): those
are not arguments of the update step, their per-device bytes reported apart.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from helpsteer_jax import runtime
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.inference import engine_steps
from helpsteer_jax.models import builder
from helpsteer_jax.models.reward import RewardModel, reward_model
from helpsteer_jax.rl.settings import RLSettings
from helpsteer_jax.scoring import genrm, remote, rules
from helpsteer_jax.scoring.load import is_factory
from helpsteer_jax.scoring.principle_verifier import VERIFIER
from helpsteer_jax.train import state as state_lib


def scorer_on_mesh(source: str) -> bool:
  """Whether `scorer.source` loads an attribute model onto the mesh (an empty source in
  a compile-only run stands for the preset's)."""
  return not (source in (rules.DEMO_RULES, VERIFIER, genrm.VERIFIER) or remote.is_url(source)
              or is_factory(source))


def judge_source(scorer: ml_collections.ConfigDict) -> str | None:
  """Where the scorer section's generative judge is (None: it has none): the source with
  `judge` set (genrm, principle), else a principle judge's `principle_source`."""
  if scorer.get("judge"):
    return str(scorer.source)
  return str(scorer.get("principle_source") or "") or None


def _judge(scorer: ml_collections.ConfigDict, rt: runtime.Runtime) -> dict:
  """The judge's weights (a causal LM of `scorer.model`), and its engine when it decodes:
  a GenRM always (its answer is generated), a principle judge when it reasons."""
  cfg = runtime.build_model_config(scorer.model)
  judge = state_lib.split_model(nnx.eval_shape(lambda: builder.new_model(cfg)), rt.mesh,
                                rt.rules, trainable=nnx.Param)
  out = {"weights": _abstract(judge.params, judge.param_shardings)}
  if scorer.get("judge") == "genrm" or int(scorer.judge_max_new_tokens) > 0:
    shards = sharding_lib.spec_shard_count(
        sharding_lib.logical_to_spec(("batch",), rt.rules), rt.mesh, 0)
    rows = -(-int(scorer.batch_size) // shards) * shards  # as make_engine rounds them
    out["engine_layers"] = _abstract(judge.params["layers"], judge.param_shardings["layers"])
    out["kv_cache"] = _kv_cache(cfg, rt, rows, int(scorer.max_len))
  return out


def _abstract(tree: Any, shardings: Any, dtype: Any = None) -> Any:
  if dtype is not None:
    tree = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype), tree)
  return sharding_lib.abstract_arrays(tree, shardings)


def _kv_cache(cfg, rt: runtime.Runtime, rows: int, length: int, dtype: Any = None) -> list:
  sharding = engine_steps.cache_sharding(rt.mesh, rt.rules)
  shape = (rows, cfg.num_kv_heads, length, cfg.head_dim)
  return [jax.ShapeDtypeStruct(shape, dtype or cfg.compute_dtype, sharding=sharding)
          for _ in range(2 * cfg.num_layers)]


def _on(shardings: Any, mesh: jax.sharding.Mesh | None) -> Any:
  """`shardings` with their specs on `mesh` (None: as they are)."""
  return shardings if mesh is None else jax.tree.map(
      lambda x: jax.sharding.NamedSharding(mesh, x.spec), shardings)


def _engine(config: ml_collections.ConfigDict, rt: runtime.Runtime, s: RLSettings,
            parts: state_lib.ModelParts, mesh: jax.sharding.Mesh | None = None) -> dict:
  cfg = runtime.model_config(config, weights=False)
  lora = bool(parts.base)
  # The engine slices the stacked layers into per-layer arrays (under LoRA, of the merged
  # weights); the embedding, final norm and head stay the policy's own arrays.
  weights = (_abstract(parts.base["layers"], _on(parts.base_shardings["layers"], mesh)) if lora
             else _abstract(parts.params["layers"], _on(parts.param_shardings["layers"], mesh)))
  dtype = s.rollout_dtype or None
  if dtype and (cfg.dtype, cfg.param_dtype) != (dtype, dtype):
    # rollout.dtype: the engine holds its own cast copy of every weight.
    # (Under LoRA the adapters are merged into the base: the base's shapes are the copy's.)
    weights = (_abstract(parts.base, _on(parts.base_shardings, mesh), dtype) if lora
               else _abstract(parts.params, _on(parts.param_shardings, mesh), dtype))
  rows = config.rollout.max_batch or s.rows
  return {"weights": weights, "kv_cache": _kv_cache(cfg, rt, rows, config.train.seq_len, dtype)}


def rollout_arrays(config: ml_collections.ConfigDict, rollout_rt: runtime.Runtime,
                   s: RLSettings, parts: state_lib.ModelParts) -> dict[str, Any]:
  """`max_staleness=1`: what the rollout devices hold: the engine, and the policy's
  weights in its own dtype (adapters merged) for the behaviour log-probs."""
  mesh = rollout_rt.mesh
  copy = (_abstract(parts.base, _on(parts.base_shardings, mesh)) if parts.base
          else _abstract(parts.params, _on(parts.param_shardings, mesh)))
  return {"engine": _engine(config, rollout_rt, s, parts, mesh), "policy_copy": copy}


def resident_arrays(config: ml_collections.ConfigDict, rt: runtime.Runtime, s: RLSettings,
                    parts: state_lib.ModelParts, tx) -> dict[str, Any]:
  """Abstract arrays (shapes, dtypes, shardings) by what holds them; `parts` is the
  policy's abstract split (LoRA: `parts.base` at the base's dtype)."""
  cfg = runtime.model_config(config, weights=False)
  out: dict[str, Any] = {} if s.max_staleness else {"engine": _engine(config, rt, s, parts)}
  if s.uses_reference and not parts.base:
    out["reference"] = _abstract(parts.params, parts.param_shardings)
  judge = judge_source(config.scorer)
  if judge is not None and scorer_on_mesh(judge):
    out["judge"] = _judge(config.scorer, rt)
  if not config.scorer.get("judge") and scorer_on_mesh(
      config.scorer.source):
    scorer_cfg = runtime.build_model_config(config.scorer.model)
    rm = state_lib.split_model(nnx.eval_shape(lambda: reward_model(scorer_cfg)), rt.mesh,
                               rt.rules, trainable=nnx.Param)
    out["attribute_model"] = _abstract(rm.params, rm.param_shardings)
  if s.algorithm.needs_critic:
    critic_cfg = (runtime.build_model_config(config.scorer.model).replace(lora=None)
                  if s.algorithm.critic_init == "scorer" else cfg)

    def make():
      return RewardModel(builder.new_model(critic_cfg), 1, head_bias=True)

    critic = state_lib.split_model(nnx.eval_shape(make), rt.mesh, rt.rules)
    state, _ = state_lib.abstract_train_state(tx, critic, rt.mesh)
    out["critic"] = state
  return out


def per_device_bytes(tree: Any) -> int:
  """Bytes one device holds of the abstract arrays `tree` (the largest shard)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shard = leaf.sharding.shard_shape(leaf.shape)
    total += int(np.prod(shard)) * np.dtype(leaf.dtype).itemsize
  return total


def breakdown(held: dict[str, Any]) -> dict[str, int]:
  """Per-device bytes of `resident_arrays`' output by holder (the engine's weights and KV
  cache apart)."""
  out = {} if "engine" not in held else {
      "engine_weights": per_device_bytes(held["engine"]["weights"]),
      "kv_cache": per_device_bytes(held["engine"]["kv_cache"])}
  out.update({name: per_device_bytes(tree) for name, tree in held.items() if name != "engine"})
  return out
