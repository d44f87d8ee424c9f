"""Online RL of a policy against the attribute model's reward (`choices.RL_ALGORITHMS`).

Prompts come from `prompts.train_path` (a JSONL of `{"prompt", "attributes"?}`
rows, HelpSteer2's rows included, or a text file), else the demo's prompt
generator; each asks for the run's attribute values (the policy's own
steerable attributes, `config.steer`), or for random ones of
`prompts.sample_attributes`. The policy starts like 2D-DPO's
(`runs.policy`); the reference is the starting policy (with fresh LoRA
adapters: the same weights with the adapters off). The loop is
`rl.trainer`'s; the HF export carries the policy source's chat template.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from helpsteer_jax import runtime
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.data.batches import ROLLOUT_BATCH
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import generator, sample_score, steering
from helpsteer_jax.models import builder
from helpsteer_jax.rl import critic as critic_lib
from helpsteer_jax.rl import objective, off_policy, report, resident, rollout, settings
from helpsteer_jax.rl import teacher as teacher_lib
from helpsteer_jax.rl.trainer import RLTrainer
from helpsteer_jax.runs import policy
from helpsteer_jax.runs import prompts as prompts_lib
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib
from helpsteer_jax.scoring import rewards as scoring_rewards
from helpsteer_jax.scoring.load import load_scorer, scorer_reads, unscored_cause
from helpsteer_jax.scoring.principle_verifier import VERIFIER as PRINCIPLE_VERIFIER
from helpsteer_jax.train import abstract_step, export

RESUMES = True  # a rerun resumes the workdir's run (main.py checks its fingerprint)


def config_reads() -> list:
  """The keys only some RL runs read: the algorithms', the rollout's, the scorer's."""
  return settings.config_reads() + scorer_reads()


def _reference(config, s: settings.RLSettings, parts, rt, fresh_adapters: bool):
  """None (no KL term), "adapters_off" (fresh LoRA adapters: the base is the starting
  policy) or a frozen copy of the starting parameters with their shardings."""
  if not s.uses_reference:
    return None
  if config.model.lora.rank and fresh_adapters:
    return "adapters_off"
  with jax.set_mesh(rt.mesh):
    ref = jax.jit(lambda p: jax.tree.map(jnp.copy, p),
                  out_shardings=parts.param_shardings)(parts.params)
  return ref, parts.param_shardings


def compile_runtime(config: ml_collections.ConfigDict, devices: list) -> runtime.Runtime:
  """The runtime `abstract_train_step` gets for `devices`: with `rollout.max_staleness=1`
  a mesh over all of them, which the step splits (`config.mesh` sizes the training half)."""
  if settings.read(config).max_staleness:
    return runtime.Runtime(sharding_lib.make_mesh((1, -1, 1), devices),
                           runtime.rules_from_config(config))
  return runtime.setup(config, devices)


def abstract_train_step(config: ml_collections.ConfigDict,
                        rt: runtime.Runtime) -> abstract_step.StepSpec:
  """The policy's update step on abstract weights and rollout batches (compile-only runs):
  `train.micro_batch` rows of `train.seq_len` tokens, `rollout.max_new_tokens` of them
  completion, with what else an iteration keeps in device memory (`rl.resident`: the
  engine's weights and KV cache, a reference copy, the attribute model, PPO's critic) as
  arguments it does not read, so that the memory report is the iteration's."""
  s = settings.read(config)
  if s.algorithm.needs_teacher:
    raise ConfigError(f"algorithm={s.algorithm.name}: the compile-only step does not model"
                      " the teacher's forward pass in the loss; run the task itself")
  rollout_rt = None
  if s.max_staleness:  # the step on the training devices; the rollout side's bytes apart
    train, rollout_devices = off_policy.split_devices(config.rollout.devices,
                                                      list(rt.mesh.devices.flat))
    rt = runtime.setup(config, train)
    rollout_rt = off_policy.rollout_runtime(config, rt, rollout_devices)
  model_cfg = runtime.model_config(config, weights=False)
  loss = functools.partial(objective.policy_objective, settings=s,
                           chunk_size=config.train.loss_chunk_size)
  fields = ROLLOUT_BATCH.row_fields(length=config.train.seq_len,
                                    completion=s.completion_width(config.train.seq_len))
  held, rollout_side = {}, {}

  def resident_arrays(parts, tx):
    held.update(resident.resident_arrays(config, rt, s, parts, tx))
    if rollout_rt is not None:
      rollout_side.update(resident.rollout_arrays(config, rollout_rt, s, parts))
    return held

  spec = abstract_step.trainer_step_spec(
      config, rt, lambda: builder.new_model(model_cfg), loss, fields,
      model_cfg.flops_per_token(config.train.seq_len), resident=resident_arrays)
  spec.resident_bytes = resident.breakdown(held)
  if rollout_rt is not None:
    spec.rollout_bytes = {"devices": rollout_rt.mesh.size, **resident.breakdown(rollout_side)}
  return spec


def _sample(s: settings.RLSettings, seed: int, pad_id: int, engine, prompts: list[list[int]],
            iteration: int) -> rollout.Rollouts:
  """An iteration's rollouts of `prompts` (token ids), the seeds as on-policy's."""
  return rollout.sample(engine, prompts, s.k, s.max_new_tokens, temperature=s.temperature,
                        top_p=s.top_p, top_k=s.top_k, seed=seed, step=iteration,
                        pad_id=pad_id)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  s = settings.read(config)
  teacher_lib.check(config, s)
  train_devices, rollout_devices = (off_policy.split_devices(config.rollout.devices)
                                    if s.max_staleness else (None, None))
  setup = setup_lib.prepare(config, workdir, devices=train_devices)
  rt, workdir, tokenizer = setup.rt, setup.workdir, setup.tokenizer
  rollout_rt = off_policy.rollout_runtime(config, rt, rollout_devices) if s.max_staleness else rt
  spec = policy.source_spec(config)
  attributes = steering.run_attributes(config, spec)
  if config.scorer.source == PRINCIPLE_VERIFIER and (s.max_staleness or s.multi_turn):
    raise ConfigError(f"scorer.source={PRINCIPLE_VERIFIER} reads each rollout's own"
                      " log-probabilities of its verdict: set rollout.max_staleness=0 and"
                      " rollout.multi_turn=false")
  # The prompts before any weights load: a bad row or none that fits fails at once.
  bad = BadRecordReport()
  read = functools.partial(prompts_lib.read_prompts, config, attributes, tokenizer,
                           config.rollout.add_bos, config.train.seq_len - s.max_new_tokens,
                           multi_turn=s.max_new_tokens if s.multi_turn else 0, report=bad)
  train_prompts, eval_prompts = read("train"), read("eval")
  # A judge's answers that do not parse give the neutral reward (`judges.genrm.NEUTRAL`).
  scorer = load_scorer(config.scorer, rt, tokenizer=tokenizer, neutral_unparsed=True)
  # Prompts a judge has no room to judge would stop the run when drawn: left out.
  train_prompts, eval_prompts = (
      [p for p, ok in zip(prompts, sample_score.judged(scorer, [p.request for p in prompts],
                                                       f"{which} prompt")) if ok]
      for prompts, which in ((train_prompts, "training"), (eval_prompts, "eval")))
  s = dataclasses.replace(s, unscored=unscored_cause(config.scorer, scorer))
  weights = scoring_rewards.weight_vector(config.scorer.weights.to_dict())
  parts, fresh_adapters = policy.load_policy(config, rt)
  reference = _reference(config, s, parts, rt, fresh_adapters)
  critic = (critic_lib.build(config, rt, s, parts, weights, setup.model_cfg.vocab_size)
            if s.algorithm.needs_critic else None)
  teacher = (teacher_lib.load(config, rt, setup.model_cfg.vocab_size)
             if s.algorithm.needs_teacher else None)
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  ro = config.rollout
  make_engine = functools.partial(
      generator.make_engine, mesh=rollout_rt.mesh, tokenizer=tokenizer, rules=rt.rules,
      max_batch=ro.max_batch or s.rows, max_length=config.train.seq_len, pad_id=int(pad),
      stop_strings=tuple(ro.stop_strings))
  ahead = None if not s.max_staleness else off_policy.OffPolicyRollouts(
      rollout_rt, list(rt.mesh.devices.flat), make_engine,
      functools.partial(_sample, s, config.seed, int(pad)),
      dtype=s.rollout_dtype, seq_len=config.train.seq_len,
      micro_batch=config.train.micro_batch, chunk_size=config.train.loss_chunk_size,
      temperature=s.temperature, pad_id=int(pad))
  trainer = RLTrainer(
      config, workdir, rt, parts, s, make_engine, scorer, weights, train_prompts,
      eval_prompts, reference,
      export.hf_exporter(workdir, setup.tokenizer_dir, tokenizer, parts, config, spec,
                         "RL-trained policy"), critic, teacher, ahead)
  logging.info("rl: %s, %d training prompts, %d eval prompts, attributes %s", s.algorithm.name,
               len(trainer.train_prompts), len(trainer.eval_prompts), attributes or "none")
  result = trainer.run()
  trainer.close()

  records = report.read_metrics(workdir)
  plot = report.plot_curves(workdir)
  summary = {"status": result.status, "iteration": result.step,
             "algorithm": s.algorithm.name, "train": result.last_metrics,
             **report.first_and_last(records),
             "eval": result.eval_history, "export": summary_lib.export_field(result),
             "plot": str(plot) if plot else None,
             "bad_records": bad.total}
  summary_lib.write_summary(
      workdir / "summary.json", summary,
      f"rl: {result.status} at iteration {result.step} ({s.algorithm.name});"
      f" {report.progress_line(records, len(trainer.eval_prompts))}; KL"
      f" {result.last_metrics.get('kl', float('nan')):.3f}"
      f"{summary_lib.outcome_text(result, 'iteration')}",
      *summary_lib.skipped_lines(bad),
      outputs={"curves": workdir / "rl_curves.png", "samples": workdir / "samples",
               **summary_lib.run_outputs(workdir)})
  return summary


