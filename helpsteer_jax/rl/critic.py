"""PPO's critic: a value head on a decoder backbone, read at every completion token.

The critic is a `RewardModel` with one output and a bias: its value at the
position that predicts completion token t is V(s_t), the same positions as
the policy's log-probabilities (`objective.pack`'s `at`), as in TRL's
PPOTrainer. It starts from

- `policy`: the starting policy's backbone and a zero head (TRL's default
  when no reward model is given; under LoRA the critic gets its own adapters
  on the policy's frozen base, shared, not copied);
- `scorer`: the attribute model's backbone and, as the head, its nine
  outputs weighted as the reward weighs them (NeMo-Aligner initialises the
  critic from the reward model), standardised by the fixed reward moments.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from helpsteer_jax import frozen_pass, runtime
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.data.batches import PPO_ROLLOUT_BATCH
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.losses import policy_gradient
from helpsteer_jax.models import builder
from helpsteer_jax.models.reward import RewardHead, RewardModel
from helpsteer_jax.rl.algorithms.ppo import PPO
from helpsteer_jax.rl.settings import RLSettings
from helpsteer_jax.scoring.load import load_reward_model
from helpsteer_jax.train import loop
from helpsteer_jax.train import state as state_lib


def completion_values(critic: RewardModel, batch: dict[str, jax.Array]) -> jax.Array:
  """[B, T] values of the states before each completion token (fp32)."""
  values = critic(batch["inputs"], batch["positions"], batch["segment_ids"])[..., 0]
  return jnp.take_along_axis(values, batch["at"], axis=1)


def value_objective(critic: RewardModel, batch: dict[str, jax.Array], *, clip: float,
                    coef: float) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(summed `coef` x clipped value loss, sums with `weight` = completion tokens) for the
  train loop, on a `data.batches.PPO_ROLLOUT_BATCH`."""
  b = PPO_ROLLOUT_BATCH.view(batch)
  values = completion_values(critic, batch)
  total = coef * policy_gradient.value_loss_sum(values, b.old_values, b.returns, b.mask, clip)
  return total, {"weight": b.mask.sum(), "value": (values * b.mask).sum()}


class Critic:
  """The critic beside the policy: its train state (own optimizer state, the policy's
  optimizer settings and schedule), its train step and its values pass."""

  def __init__(self, parts: state_lib.ModelParts, tx, schedule, rt: runtime.Runtime,
               ppo: PPO, accum: int, micro: int, seed: int):
    self.parts, self.rt, self.micro = parts, rt, micro
    self.state, self.shardings = state_lib.create_train_state(tx, parts, rt.mesh, seed)
    rules = rt.rules
    loss = functools.partial(value_objective, clip=ppo.value_clip, coef=ppo.value_coef)
    step = loop.make_train_step(parts, loss, tx, schedule, rules, accum)
    self.step = loop.jit_train_step(step, rt, self.shardings, loop.step_batch_sharding(rt),
                                    (parts.base_shardings,))
    self.rows_sharding = NamedSharding(rt.mesh, sharding_lib.batch_spec(rules))

    def values(params, base, batch):
      with sharding_lib.axis_rules(rules):
        return completion_values(state_lib.merge_model(parts, params, base), batch)

    self._values = frozen_pass.FrozenPass(values, rt.mesh, self.rows_sharding, micro,
                              (self.shardings.params, parts.base_shardings))

  def abstract_state(self):
    return sharding_lib.abstract_arrays(self.state, self.shardings)

  def values(self, rows: dict[str, np.ndarray]) -> np.ndarray:
    """[R, T] values of the rollout rows' states."""
    fields = ("inputs", "positions", "segment_ids", "at")
    return self._values((self.state.params, self.parts.base), {k: rows[k] for k in fields})

  def update(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """One optimizer step on a minibatch (the policy's batch layout); its metrics."""
    with jax.set_mesh(self.rt.mesh):
      self.state, metrics = self.step(self.state, batch, self.parts.base)
    return metrics


def _copy(tree, shardings, mesh):
  with jax.set_mesh(mesh):
    return jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=shardings)(tree)


def _backbone(tree: dict) -> dict:
  return {k: v for k, v in tree.items() if k != "lm_head"}


def from_policy(config: ml_collections.ConfigDict, rt: runtime.Runtime,
                policy: state_lib.ModelParts) -> state_lib.ModelParts:
  """A critic on the starting policy's backbone (call it before the policy's train state
  takes the policy's parameters)."""
  cfg = runtime.model_config(config)
  backbone = builder.init_model(cfg.replace(lora=None), rt.mesh, rt.rules, seed=config.seed + 1)
  backbone = runtime.attach_adapters(config, backbone, rt, cfg.lora)
  parts = state_lib.split_model(RewardModel(backbone, 1, head_bias=True), rt.mesh, rt.rules)
  if parts.base:  # LoRA: the critic's adapters sit on the policy's frozen base
    parts.base = {**parts.base, "backbone": _backbone(policy.base)}
  else:
    parts.params = {**parts.params, "backbone": _copy(
        _backbone(policy.params), parts.param_shardings["backbone"], rt.mesh)}
  return parts


def from_scorer(config: ml_collections.ConfigDict, rt: runtime.Runtime, s: RLSettings,
                weights: np.ndarray, policy_vocab: int) -> state_lib.ModelParts:
  """A critic on the attribute model's backbone, its head the reward's weighting."""
  sc = config.scorer
  rm = load_reward_model(sc.source, rt, sc.model, sc.head)
  if rm.cfg.vocab_size != policy_vocab:
    raise ConfigError(f"loss.critic_init=scorer: the attribute model's vocabulary"
                      f" ({rm.cfg.vocab_size}) is not the policy's ({policy_vocab}); the"
                      " critic reads the policy's tokens: use loss.critic_init=policy")
  kernel = np.asarray(jax.device_get(rm.head.kernel[...]), np.float64) @ weights
  bias = (float(np.asarray(jax.device_get(rm.head.bias[...])) @ weights)
          if rm.head.has_bias else 0.0)
  if s.normalize == "fixed":
    kernel, bias = kernel / s.reward_std, (bias - s.reward_mean) / s.reward_std
  head = RewardHead(rm.cfg.hidden_size, 1, bias=True)
  head.kernel[...] = jnp.asarray(kernel[:, None], jnp.float32)
  head.bias[...] = jnp.asarray([bias], jnp.float32)
  rm.head = head
  return state_lib.split_model(rm, rt.mesh, rt.rules, trainable=nnx.Param)


def build(config: ml_collections.ConfigDict, rt: runtime.Runtime, s: RLSettings,
          policy: state_lib.ModelParts, weights: np.ndarray,
          policy_vocab: int) -> state_lib.ModelParts:
  """The critic `loss.critic_init` names."""
  if s.algorithm.critic_init == "scorer":
    return from_scorer(config, rt, s, weights, policy_vocab)
  return from_policy(config, rt, policy)
