"""The RL loop: rollouts, rewards, advantages and policy updates on one mesh.

An iteration:

1. samples K completions for each of its P prompts with the current policy
   and scores them with the attribute scorer (`rollout.sample_and_score` on
   `inference.sample_score`, the engine's batch API; the prompts of iteration
   i and every completion's seed are derived from (seed, i), so a resumed or
   repeated iteration draws the same ones, and the same predictions, on every
   process);
2. turns the predictions into rewards (`rewards`);
3. computes the reference's log-probabilities on the training path, and the
   sampling policy's where the ratio needs them (`rl.logprob_pass`), dispatched
   before scoring;
4. computes the algorithm's advantages (`rl.algorithms`) and runs `loss.epochs` passes of
   optimizer steps of `train.global_batch` completions (the shared train
   step of `train.loop`, gradient accumulation included);
5. puts the new weights into the engine (`Engine.load_weights`, no recompile).

With `rollout.max_staleness=1` step 1 takes the rollouts sampled during the last
update on the rollout devices and starts the next iteration's (`rl.off_policy`).

A checkpoint is written after an iteration (the train state, and the
running reward moments as the data item); a run killed inside an iteration
resumes at its start and repeats it exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import time
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.sharding import NamedSharding

from helpsteer_jax import runtime
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.inference.engine import Engine
from helpsteer_jax.losses import sampler_correction
from helpsteer_jax.models import builder
from helpsteer_jax.rl import critic as critic_lib
from helpsteer_jax.rl import (
  dynamic_sampling,
  evaluation,
  logprob_pass,
  multiturn,
  objective,
  rewards,
  rollout,
)
from helpsteer_jax.rl import off_policy as off_policy_lib
from helpsteer_jax.rl.rollout import Prompt
from helpsteer_jax.rl.settings import RLSettings
from helpsteer_jax.scoring import rewards as scoring_rewards
from helpsteer_jax.scoring.scorer import Scorer
from helpsteer_jax.train import base_fingerprint, loop, optim, run_loop
from helpsteer_jax.train import checkpoint as ckpt_lib
from helpsteer_jax.train import state as state_lib
from helpsteer_jax.train.run_loop import RunResult


class HostState:
  """What the loop keeps on the host between iterations, checkpointed as the data item:
  the running reward moments, and the rollouts sampled ahead (`rl.off_policy`)."""

  def __init__(self):
    self.moments = rewards.RunningMoments()
    self.ahead: dict | None = None

  def get_state(self) -> bytes:
    state = dataclasses.asdict(self.moments)
    if self.ahead is not None:
      state["ahead"] = self.ahead
    return json.dumps(state).encode()

  def set_state(self, state: bytes) -> None:
    fields = json.loads(state)
    self.ahead = fields.pop("ahead", None)
    self.moments = rewards.RunningMoments(**fields)

  def start_prefetch(self) -> None:
    pass


class RLTrainer:
  """Runs `train.num_steps` iterations of `settings.algorithm` (see the module doc); the
  algorithm decides what the iteration computes (reference, critic, advantages, loss).

  `reference`: None for no reference, "adapters_off" for the LoRA base, else
  (frozen params, their shardings). `weights`: the reward's [9] weights.
  `make_engine(model)` builds the decoding engine on the (restored) policy.
  `critic`: PPO's value model (`rl.critic`), trained beside the policy with
  its own optimizer state, checkpointed as the item `critic`.
  `teacher`: distillation's frozen teacher (`rl.teacher.Teacher`), whose objective
  replaces the policy objective, its params an argument of the train step.
  `off_policy`: the rollout side of `rollout.max_staleness=1` (`rl.off_policy`), whose
  engine replaces `make_engine`'s.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
               rt: runtime.Runtime, parts: state_lib.ModelParts, settings: RLSettings,
               make_engine: Callable[[Any], Engine], scorer: Scorer, weights: np.ndarray,
               train_prompts: Sequence[Prompt], eval_prompts: Sequence[Prompt],
               reference: Any = None, export_fn: Callable | None = None,
               critic: state_lib.ModelParts | None = None, teacher: Any = None,
               off_policy: off_policy_lib.OffPolicyRollouts | None = None):
    self.config, self.rt, self.parts, self.s = config, rt, parts, settings
    self.scorer, self.weights = scorer, weights
    self.train_prompts, self.eval_prompts = list(train_prompts), list(eval_prompts)
    self.workdir, self.tc, self.export_fn = pathlib.Path(workdir), config.train, export_fn
    loop.check_batch_config(self.tc, rt)
    self.accum = self.tc.global_batch // self.tc.micro_batch
    self.tx, self.schedule = optim.make_optimizer(config.optimizer,
                                                  self.tc.num_steps * settings.updates)
    self.host = HostState()
    self.judge = evaluation.judge_of(config.scorer)
    self.best = run_loop.best_metric(self.tc)
    self.checkpointer = ckpt_lib.Checkpointer(
        self.workdir / "checkpoints", self.tc.save_every, self.tc.keep_checkpoints,
        async_save=self.tc.async_checkpoint, extra_items=("critic",) if critic else (),
        best=self.best)
    self.state, self.state_shardings = state_lib.create_train_state(
        self.tx, parts, rt.mesh, config.seed)
    self.critic = None if critic is None else critic_lib.Critic(
        critic, self.tx, self.schedule, rt, settings.algorithm, self.accum,
        self.tc.micro_batch, config.seed + 1)
    extra = None if critic is None else {"critic": self.critic.abstract_state()}
    resuming = self.checkpointer.latest_step() is not None
    base_fingerprint.check_or_record(self.checkpointer.directory, parts.base, resuming)
    restored = self.checkpointer.restore_latest(
        sharding_lib.abstract_arrays(self.state, self.state_shardings), self.host, extra)
    if restored is not None:
      self.state, others = restored if critic is not None else (restored, {})
      if critic is not None:
        self.critic.state = others["critic"]
      logging.info("resuming at iteration %d", self.iteration)
    self.batch_sharding = loop.step_batch_sharding(rt)
    self.rows_sharding = NamedSharding(rt.mesh, sharding_lib.batch_spec(rt.rules))
    self._compile(reference, teacher)
    self.off_policy = off_policy
    if off_policy is None:
      self.engine = make_engine(self.engine_model())
    else:
      off_policy.load(self.policy_model())
      off_policy.restore(self.host.ahead)
      self.engine = off_policy.engine

  @property
  def iteration(self) -> int:
    return int(jax.device_get(self.state.step)) // self.s.updates

  # -- compiled functions ------------------------------------------------------

  def _compile(self, reference: Any, teacher: Any = None) -> None:
    parts, rules, chunk = self.parts, self.rt.rules, self.tc.loss_chunk_size
    loss = functools.partial(objective.policy_objective, settings=self.s, chunk_size=chunk)
    if teacher is not None:
      loss = teacher.objective(self.s, chunk)
    self._train_frozen = () if teacher is None else (teacher.params,)
    step = loop.make_train_step(parts, loss, self.tx, self.schedule, rules, self.accum)
    self.train_step = loop.jit_train_step(
        step, self.rt, self.state_shardings, self.batch_sharding,
        (parts.base_shardings, *(() if teacher is None else (teacher.shardings,))))
    self.logprobs = logprob_pass.LogprobPass(
        parts, self.rt, self.s, reference, self.state_shardings.params, self.rows_sharding,
        self.tc.micro_batch, chunk)

  def _dispatch(self, rows: dict[str, np.ndarray]) -> list:
    return self.logprobs.dispatch(self.state.params, self.parts.base, rows)

  def policy_model(self):
    """The current policy as the engine decodes it (LoRA adapters merged in)."""
    model = state_lib.merge_model(self.parts, self.state.params)
    return builder.merge_adapters(model) if state_lib.has_adapters(model) else model

  def engine_model(self):
    """The policy in the engine's dtype (`rollout.dtype`)."""
    model = self.policy_model()
    dtype = self.s.rollout_dtype
    if not dtype or (model.cfg.dtype, model.cfg.param_dtype) == (dtype, dtype):
      return model
    return builder.with_dtype(model, dtype)

  # -- one iteration -------------------------------------------------------------

  def prompt_indices(self, iteration: int) -> list[int]:
    """The P prompts of `iteration` (`rollout.prompt_schedule`)."""
    return rollout.prompt_schedule(len(self.train_prompts), self.s.prompts, self.config.seed,
                                   iteration)

  def _requested(self, prompts: Sequence[Prompt], per_prompt: int) -> list[dict]:
    return [prompts[b // per_prompt].request.attributes
            for b in range(len(prompts) * per_prompt)]

  def _scores(self, preds: np.ndarray, requested: list[dict], r: rollout.Rollouts
              ) -> tuple[np.ndarray, np.ndarray]:
    return rewards.iteration_scores(preds, self.weights, requested, r.finished,
                                    rollout.longest_answer(r.mask), self.s, self.host.moments)

  def sample_and_score(self) -> Callable:
    """`rollout.sample_and_score`, or its multi-turn form (`rl.multiturn`)."""
    if not self.s.multi_turn:
      return rollout.sample_and_score
    return functools.partial(multiturn.sample_and_score,
                             width=self.s.completion_width(self.tc.seq_len),
                             reward=self.s.multi_turn_reward)

  def _sample(self, iteration: int, indices: list[int], first: int = 0,
              on_sampled: Callable | None = None) -> tuple[rollout.Rollouts, np.ndarray, Any]:
    s = self.s
    return self.sample_and_score()(
        self.engine, [self.train_prompts[i] for i in indices], s.k, s.max_new_tokens,
        self.scorer, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
        seed=self.config.seed, step=iteration, pad_id=self.engine.pad_id,
        on_sampled=on_sampled, first=first)

  def _dynamic_rollouts(self, iteration: int, first: list[int]
                        ) -> tuple[dynamic_sampling.Round, dict[str, float], float]:
    """The iteration's groups by dynamic sampling (`rl.dynamic_sampling`), its metrics
    and the seconds spent sampling."""
    s, sampling_s = self.s, [0.0]

    def sample_round(round_: int, indices: list[int]) -> dynamic_sampling.Round:
      t = time.perf_counter()

      def sampled(_):
        sampling_s[0] += time.perf_counter() - t

      r, preds, _ = self._sample(iteration, indices, round_ * s.prompts, sampled)
      prompts = [self.train_prompts[i] for i in indices]
      reward, scores = self._scores(preds, self._requested(prompts, s.k), r)
      return dynamic_sampling.Round(indices, r, preds, reward, scores)

    batch, metrics = dynamic_sampling.collect(
        sample_round, first, len(self.train_prompts), s.k,
        s.algorithm.dynamic_sampling_rounds, self.config.seed, iteration)
    return batch, metrics, sampling_s[0]

  def run_iteration(self, iteration: int) -> dict[str, float]:
    """Samples, scores and trains once; the iteration's metrics."""
    s, tc = self.s, self.tc
    t0 = time.perf_counter()
    indices = self.prompt_indices(iteration)
    ahead = None
    if self.off_policy is not None:  # sampled during the last update (`rl.off_policy`)
      # The next iteration's too after the last one: a run continued to more iterations
      # trains as an uninterrupted one.
      ahead = self.off_policy.advance(iteration, [self.train_prompts[i].ids for i in indices],
                                      [self.train_prompts[i].ids
                                       for i in self.prompt_indices(iteration + 1)])
      r, t_rollout, extra = ahead.rollouts, ahead.seconds, ahead.metrics(iteration)
      t0 = time.perf_counter() - t_rollout
    elif s.algorithm.dynamic_sampling_rounds:
      batch, extra, t_rollout = self._dynamic_rollouts(iteration, indices)
      r, preds, reward, scores, indices = (batch.rollouts, batch.preds, batch.rewards,
                                           batch.scores, batch.prompts)
    else:
      def sampled(r: rollout.Rollouts) -> tuple[float, dict[str, np.ndarray], list]:
        rows = objective.pack(r, tc.seq_len, self.engine.pad_id)
        return time.perf_counter() - t0, rows, self._dispatch(rows)

      r, preds, (t_rollout, rows, pending) = self._sample(iteration, indices,
                                                          on_sampled=sampled)
      extra = {}
    if ahead is not None or s.algorithm.dynamic_sampling_rounds:
      rows = objective.pack(r, tc.seq_len, self.engine.pad_id)
      pending = self._dispatch(rows)
    if ahead is not None:
      preds = rollout.score(r, [self.train_prompts[i] for i in indices], self.scorer)
    requested = self._requested([self.train_prompts[i] for i in indices], s.k)
    if not s.algorithm.dynamic_sampling_rounds:
      reward, scores = self._scores(preds, requested, r)
    raw = scoring_rewards.rewards(preds, self.weights)
    t_score = time.perf_counter() - t0 - t_rollout
    old_logp, ref_logp, recomputed = self.logprobs.fetch(
        pending, r, None if ahead is None else ahead.behaviour_logp)
    mask = r.mask
    # DAPO's overlong filtering: a completion cut at the limit is no evidence either way.
    loss_mask = mask * r.finished[:, None] if s.algorithm.filter_truncated else mask
    kl_seq = ((old_logp - ref_logp) * mask).sum(-1)
    scores = s.algorithm.shape_scores(scores, old_logp, ref_logp, mask)
    weights = (sampler_correction.weights(old_logp, r.sampler_logp, loss_mask,
                                          s.sampler_correction, s.sampler_correction_cap)
               if s.sampler_correction else np.ones_like(mask))
    rows.update(mask=loss_mask, old_logp=old_logp * mask, ref_logp=ref_logp * mask,
                sampler_weight=weights)
    rows["advantages"] = s.algorithm.advantages(rows, scores, s.k, old_logp, ref_logp,
                                                self.critic)
    t_update0 = time.perf_counter()
    sums = self._updates(iteration, rows)
    t_update = time.perf_counter() - t_update0
    if self.off_policy is not None:
      extra["rollout_wait_s"] = self.off_policy.finish()
      self.host.ahead = self.off_policy.state()
      self.off_policy.load(self.policy_model())
    else:
      self.engine.load_weights(self.engine_model())

    tokens = float(mask.sum())
    row_tokens = float(np.sum(rows["segment_ids"] > 0))
    metrics = {
        "reward": float(np.mean(raw)), "reward_normalized": float(np.mean(reward)),
        "reward_std": float(np.std(raw)), "score": float(np.mean(scores)),
        "entropy": float(-(old_logp * mask).sum() / max(tokens, 1.0)),
        "response_length": tokens / len(mask),
        "truncated": float(np.mean(~r.finished)),
        "rollout_tokens_per_s": tokens / max(t_rollout, 1e-9),
        "update_tokens_per_s": s.epochs * row_tokens / max(t_update, 1e-9),
        "rollout_s": t_rollout, "score_s": t_score, "update_s": t_update,
        "iteration_s": time.perf_counter() - t0, **sums, **extra}
    if r.answers is not None:
      metrics["turns"] = float(np.mean([len(a) for a in r.answers]))
    if self.logprobs.with_ref:
      metrics["kl"] = float(np.mean(kl_seq))
    if recomputed:
      metrics["sampler_logp_gap"] = float(np.abs((r.sampler_logp - old_logp) * mask).sum()
                                          / max(tokens, 1.0))
      metrics.update(sampler_correction.metrics(
          old_logp, r.sampler_logp, mask, weights if s.sampler_correction else None,
          s.sampler_correction or "token_truncate"))
    if self.judge:  # a judge's own measure; its reward slot holds no attribute values
      metrics["parse_failures"] = evaluation.parse_failures(self.judge,
                                                            evaluation.final_answers(r))
    elif s.steer_coef or any(requested):
      metrics["steer_distance"] = float(np.mean(rewards.steering_distance(
          preds, requested, s.steer_attributes)))
    return metrics

  def _updates(self, iteration: int, rows: dict[str, np.ndarray]) -> dict[str, float]:
    """`loss.epochs` passes of optimizer steps over the rollout rows; mean metrics."""
    s, g, micro = self.s, self.tc.global_batch, self.tc.micro_batch
    fields = s.algorithm.batch.names
    pending, critic_pending = [], []
    for epoch in range(s.epochs):
      order = np.random.default_rng([self.config.seed, iteration, epoch]).permutation(s.rows)
      for u in range(s.updates_per_epoch):
        idx = np.sort(order[u * g:(u + 1) * g])
        batch = {k: loop.global_array(rows[k][idx].reshape((self.accum, micro)
                                                           + rows[k].shape[1:]),
                                      self.batch_sharding) for k in fields}
        with jax.set_mesh(self.rt.mesh):
          self.state, metrics = self.train_step(self.state, batch, self.parts.base,
                                                *self._train_frozen)
        if self.critic is not None:
          critic_pending.append(self.critic.update(batch))
        pending.append(metrics)
    fetched = [{k: float(v) for k, v in m.items()} for m in jax.device_get(pending)]
    loop.check_finite(int(jax.device_get(self.state.step)), fetched[-1],
                      self.tc.max_consecutive_nonfinite)
    mean = {k: float(np.mean([f[k] for f in fetched])) for k in fetched[0]}
    tokens = max(mean.pop("tokens"), 1e-9)
    out = {"loss": mean["loss"], "grad_norm": mean["grad_norm"],
           "learning_rate": fetched[-1]["learning_rate"],
           "clip_fraction": mean["clipped"] / tokens}
    if "kl" in mean:
      out["kl_k3"] = mean["kl"] / tokens
    out.update({k: mean[k] / tokens for k in s.algorithm.token_metrics})
    if critic_pending:
      fetched = [{k: float(v) for k, v in m.items()} for m in jax.device_get(critic_pending)]
      loop.check_finite(int(jax.device_get(self.critic.state.step)), fetched[-1],
                        self.tc.max_consecutive_nonfinite)
      out.update(value_loss=float(np.mean([f["loss"] for f in fetched])),
                 value=float(np.mean([f["value"] for f in fetched])),
                 value_grad_norm=float(np.mean([f["grad_norm"] for f in fetched])))
    return out

  # -- evaluation ------------------------------------------------------------------

  def steering_on(self) -> bool:
    return evaluation.steering_requested(self.s.steer_coef, self.eval_prompts)

  def evaluate(self, iteration: int, max_new_tokens: int) -> dict[str, float]:
    """`rl.evaluation.evaluate` of the current policy on the eval prompts."""
    return evaluation.evaluate(self.engine, self.eval_prompts, self.scorer, self.weights,
                               self.s.steer_attributes, max_new_tokens, self.workdir,
                               iteration, self.sample_and_score(), self.judge,
                               self.steering_on())

  # -- the loop ----------------------------------------------------------------------

  def run(self, stop_at: int | None = None) -> RunResult:
    """Iterations to `train.num_steps` (or `stop_at`) on the shared loop
    (`train.run_loop`): greedy evals at iteration 0, every `train.eval_every` and at
    the end; a checkpoint per iteration."""
    run_loop.check_reported(
        self.best, evaluation.reported(self.judge, self.steering_on()),
        "" if self.eval_prompts else "give eval prompts (prompts.eval_path, prompts.eval_limit)")
    done: dict[str, float] = {}

    def step(it: int) -> None:
      done.clear()
      done.update(self.run_iteration(it))

    def logged(_: int, force: bool):
      return dict(done), 1, {"reward": f"{done['reward']:.3f}",
                             "kl": f"{done.get('kl', float('nan')):.3f}",
                             "tok_s": f"{done['rollout_tokens_per_s']:.0f}"}

    hooks = run_loop.Hooks(
        step=step, logged=logged,
        save=lambda it, preempted, evals: self.checkpointer.save(
            it, self.state, self.host, preempted=preempted, extra=self._extra(),
            metrics=evals),
        save_final=lambda it, evals: self.checkpointer.save_final(
            it, self.state, self.host, extra=self._extra(), metrics=evals),
        wait=self.checkpointer.wait,
        evaluate=lambda it: self.evaluate(it, self.s.max_new_tokens), initial_eval=True,
        export=(None if self.export_fn is None
                else lambda it: self.export_fn(self.params_at(it))),
        best=self.checkpointer.best)
    return run_loop.run_steps(self.config, self.workdir, self.iteration, hooks, stop_at)

  def params_at(self, iteration: int | None) -> dict:
    """The policy's trained params now (`iteration` None) or in checkpoint `iteration`."""
    return self.checkpointer.params_at(iteration, self.iteration, self.state.params,
                                       self.state_shardings.params)

  def _extra(self) -> dict | None:
    return {"critic": self.critic.state} if self.critic is not None else None

  def close(self) -> None:
    self.checkpointer.close()
    if self.off_policy is not None:
      self.off_policy.close()
