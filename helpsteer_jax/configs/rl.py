"""Online RL with the attribute model as the reward: RLOO, GRPO, PPO, GSPO, DAPO;
on-policy distillation of a teacher (`distill`).

  # the default AC-SFT run's policy, the demo prompts, the demo data's rules as the reward
  helpsteer-jax --config=configs/acsft.py && helpsteer-jax --config=configs/rl.py
  # GRPO with the trained demo attribute model as the reward
  helpsteer-jax --config=configs/rl.py --config.algorithm=grpo \
      --config.scorer.source=workdir/attribute_model
  # HelpSteer2-Preference's REINFORCE-leave-one-out on Llama 3 70B with LoRA
  helpsteer-jax --config=configs/rl.py:llama3_70b \
      --config.init.source=/models/Llama-3-70B-SteerLM-HF \
      --config.prompts.train_path=/data/helpsteer2/train.jsonl.gz \
      --config.scorer.source=/runs/attribute_model_70b --config.model.lora.rank=16
  # multi-turn: the policy answers both of MT-Bench's questions, the last answer scored
  helpsteer-jax --config=configs/rl.py --config.rollout.multi_turn=true \
      --config.prompts.train_path=data/mt_bench/question.jsonl
  # on-policy distillation: the teacher's per-token reverse KL on the policy's samples
  helpsteer-jax --config=configs/rl.py --config.algorithm=distill \
      --config.teacher.source=workdir/acsft

Each iteration samples `rollout.samples_per_prompt` completions for each of
`rollout.prompts_per_iteration` prompts with the current policy, scores them
with `config.scorer` (rewards: the weighted attribute predictions, normalised,
minus the steering distance), and updates the policy `loss.epochs` times over
the batch in optimizer steps of `train.global_batch` completions.
`train.num_steps` counts iterations.

Presets: the default (the demo AC-SFT run's tiny policy, demo prompts),
`smollm2_135m` (GRPO), `llama3_8b`, `llama3_70b` (RLOO with HelpSteer2's PPO settings:
lr 1e-7, KL 3e-3 in the reward, the 0.65/0.8/0.45 reward); `genrm` (a GenRM trained by
GRPO on HelpSteer3 with the verifier reward: the demo, docs/tasks/genrm.md) and `genrm_llama3_70b`;
`principle` (RLBFF's principle judge trained by GRPO on HelpSteer3's principle rows,
`prompts.train_path` their directory; by default the CPU demo's rows and answer-format
policy: see docs/tasks/principle_rm.md).
"""

import ml_collections
from ml_collections.config_dict import placeholder

from helpsteer_jax import config_base
from helpsteer_jax.config_sections import (
  DEFAULT_STOP_STRINGS,
  DEFAULT_SYSTEM,
  demo_policy,
  optimizer_config,
  scorer_on_mesh,
  scorer_section,
  steer_config,
  train_config,
)

PRESETS = ("demo", "smollm2_135m", "llama3_8b", "llama3_70b", "genrm", "genrm_llama3_70b",
           "principle")
RUN_KEYS = ("algorithm",)  # default workdir suffix: workdir/rl_dapo
GENRM_DEMO_DATA = "workdir/genrm_demo"  # python -m helpsteer_jax.runs.genrm_prompts writes it
GENRM_DEMO_POLICY = "workdir/acsft_genrm"  # the AC-SFT run on its answer-format rows (65 steps)
PRINCIPLE_DEMO_DATA = "workdir/principle_demo"  # python -m helpsteer_jax.runs.principle_demo
PRINCIPLE_DEMO_POLICY = "workdir/acsft_principle"  # the AC-SFT run on its format rows (80 steps)
RENAMED = config_base.MODEL_RENAMED
# HelpSteer2's PPO reward (arXiv 2406.08673): helpfulness, correctness and coherence only.
PPO_WEIGHTS = {"helpfulness": 0.65, "correctness": 0.8, "coherence": 0.45, "complexity": 0.0,
               "verbosity": 0.0}


def _prompts():
  return ml_collections.ConfigDict(dict(
      # .jsonl ({"prompt", "attributes"?}; HelpSteer2 rows; MT-Bench's {"turns": [...]}),
      # text, "" = demo
      train_path="",
      eval_path="",       # prompts whose greedy answers are scored; "" = 50 held-out demo ones
      system=DEFAULT_SYSTEM,
      eval_limit=50,      # the first N eval prompts (0 = all)
      demo_train_prompts=1024,
      # Steerable attributes drawn at random per prompt (0..4) instead of the run's values,
      # e.g. "complexity,verbosity": RL then sees (and the steering reward scores) many.
      sample_attributes="",
      # "jsonl" (the paths above); HelpSteer3's files as judge prompts with their labels
      # as each row's `reference`: "genrm" (the preference config: the dataset's
      # directory, the config's, or a file; eval_path "" = its validation split;
      # runs/genrm_prompts.py) or "principle" (the principle config, rl:principle)
      format="jsonl",
      feedback_path="",          # genrm: the feedback config ("" = <train_path>/feedback)
      genrm_guidelines=True,     # genrm: the full prompt (False: the short one)
      genrm_both_orders=False,   # genrm: each pair also shown the other way round
      domains="", languages=""))  # genrm, principle: comma-separated filters ("" = every row)


def _rollout():
  return ml_collections.ConfigDict(dict(
      prompts_per_iteration=16,
      samples_per_prompt=4,   # K: RLOO's and GRPO's group size (>= 2)
      max_new_tokens=64,
      temperature=1.0, top_p=1.0, top_k=0,
      max_batch=0,            # rows the engine decodes at once; 0 = every completion
      # The engine's compute and weight dtype ("" = the policy's model.dtype), e.g.
      # bfloat16 rollouts of an fp32 update (see loss.sampler_correction)
      dtype="",
      # 1: one-step-off-policy, each iteration's rollouts sampled on their own devices
      # during the previous iteration's update (weights synced after each update; the
      # loss's ratio against the sampling weights' log-probs); 0: on-policy
      max_staleness=0,
      devices=0,              # max_staleness=1: devices given to rollouts (0 = half)
      # The rollout devices' mesh (max_staleness=1); the training mesh is config.mesh
      mesh=config_base.mesh_config(data=-1, fsdp=1, tensor=1),
      # The policy answers every user turn of a prompt in order (MT-Bench's "turns",
      # HelpSteer2's multi-turn contexts without their own answers); each answer at most
      # max_new_tokens; the reward scores the "final" answer or "each" (their mean)
      multi_turn=False, multi_turn_reward="final",
      add_bos=True,
      stop_strings=tuple(DEFAULT_STOP_STRINGS)))


def _loss():
  return ml_collections.ConfigDict(dict(
      kl_coef=0.05,        # rloo, ppo: the KL to the reference in the reward
      # grpo, gspo: k3 KL to the reference per token in the loss; unset = the algorithm's
      # own (grpo 0.04, gspo 0: the GSPO paper's)
      beta=placeholder(float),
      # Ratio clipping (DAPO: eps_high > eps_low); unset = the algorithm's own (0.2, 0.2;
      # gspo 3e-4, 4e-4: the GSPO paper's, for its sequence-level ratio)
      eps_low=placeholder(float), eps_high=placeholder(float),
      aggregation="",      # "sequence" | "token" | "dr_grpo"; "" = the algorithm's own
      normalize_advantages=False,  # rloo: whiten advantages over the batch
      # rloo: "token" (the clipped ratio per token, the batch's token mean) or "trl" (TRL
      # RLOOTrainer's: one ratio per completion, the sum of its token log-ratios, clipped
      # per completion, the mean over completions; whitening eps 1e-4)
      rloo_form="token",
      scale_advantages=True,       # grpo, gspo: divide by the group's std (False: Dr. GRPO)
      # gspo: "sequence" (one clipped ratio per completion) or "sequence_token" (GSPO-token)
      importance_level=placeholder(str),
      truncation_penalty=0.0,      # subtracted from completions cut at max_new_tokens
      # DAPO's rollout side, for any algorithm; unset = the algorithm's own (off; dapo: on).
      # Overlong shaping: 0 up to max_new_tokens - overlong_buffer tokens, then falling
      # linearly to -overlong_penalty at the limit (dapo: a fifth of max_new_tokens, 1.0)
      overlong_buffer=placeholder(int), overlong_penalty=placeholder(float),
      filter_truncated=placeholder(bool),  # completions cut at the limit out of the loss
      # Groups whose rewards are all equal replaced by further prompts' groups, in up to
      # this many extra rollout rounds (dapo: 10; 0 = off)
      dynamic_sampling_rounds=placeholder(int),
      # Truncated importance sampling of the sampler's log-prob gap (TRL's
      # vllm_importance_sampling_mode): "" (off), token_truncate, token_mask,
      # sequence_truncate, sequence_mask; the cap C (TRL 1.9's 3.0)
      sampler_correction="", sampler_correction_cap=3.0,
      # The reference's log-probs for the `kl` metric when the algorithm has no KL term
      # (gspo, dapo: beta 0): a frozen copy of the policy (free with fresh LoRA adapters)
      track_kl=False,
      reward_coef=0.0,     # distill: the GRPO term on the reward's advantages (0: pure KD)
      epochs=1,            # passes over a rollout batch (> 1: ratios move off 1, clipping)
      # Recompute the sampling policy's log-probs on the training path even with one
      # optimizer step per rollout batch (always done with several, or top-p/top-k).
      recompute_logprobs=False,
      # ppo
      gamma=1.0, lam=0.95, value_clip=0.2, value_coef=0.1,
      critic_init="policy"))  # "policy" or "scorer" (the attribute model's backbone)


def _reward():
  return ml_collections.ConfigDict(dict(
      normalize="running",  # "running" (moments of every reward so far), "fixed", "none"
      mean=0.0, std=1.0,    # normalize=fixed: (reward - mean) / std
      stats_path="",        # normalize=fixed: a JSON {"mean":, "std":} (e.g. the RM's train set)
      steer_coef=0.0,       # lambda: minus lambda * |predicted - requested| (steerable attrs)
      steer_attributes="complexity,verbosity"))


def _teacher():
  """distill's teacher: an HF directory or a training run with the policy's vocabulary;
  its shape is its own (`model.*` fill what a run's parameter shapes leave open)."""
  own = ml_collections.ConfigDict({"name": placeholder(str)})
  for name, kind in config_base.SHAPE_FIELDS.items():
    own[name] = placeholder(kind)
  return ml_collections.ConfigDict(dict(source="", step=-1, model=own))


def _demo(config):
  demo_policy(config, num_steps=40, global_batch=64, micro_batch=64, log_every=1,
              eval_every=10, save_every=10)
  config.optimizer = optimizer_config(lr=5e-5, schedule="constant", warmup_steps=0,
                                      weight_decay=0.0, grad_clip=1.0)
  return config


def _principle(config):
  """RLBFF's principle judge trained by GRPO: HelpSteer3's principle rows as prompts, the
  judge's own signed log p(" Yes") - log p(" No") as the reward, unnormalised. By default
  the demo: its rows and the AC-SFT run on their answer format (docs/tasks/principle_rm.md)."""
  config.algorithm = "grpo"
  config.prompts.update(format="principle", train_path=PRINCIPLE_DEMO_DATA)
  config.init.source = PRINCIPLE_DEMO_POLICY
  config.scorer.source = "principle_verifier"
  for name in config.scorer.weights:
    config.scorer.weights[name] = 1.0 if name == "helpfulness" else 0.0
  config.reward.normalize = "none"
  # The demo's judge prompts (a conversation, a response, a principle) and its answers (a
  # one-sentence reasoning, then the judgement)
  config.train.update(seq_len=320, num_steps=60, global_batch=32, micro_batch=32,
                      eval_every=10, save_every=10)
  config.rollout.update(prompts_per_iteration=8, samples_per_prompt=4, max_new_tokens=40)
  config.prompts.eval_limit = 100
  config.optimizer.lr = 7e-4
  # The reward is fixed by the tokens before the verdict, so the verdict token's own update
  # is noise; a stronger KL term keeps it following the reasoning, as the answer-format run
  # left it
  config.loss.beta = 0.3
  return config


def _big(config, preset, *, lr, algorithm, loss=None, tensor=1):
  """A published model's recipe with `algorithm` and its own `loss` keys (e.g. RLOO's KL
  in the reward, `kl_coef`)."""
  config.algorithm = algorithm
  config.model = config_base.model_section(preset, dtype="bfloat16", param_dtype="float32",
                                          remat_policy="full")
  config.train = train_config(num_steps=200, global_batch=128, micro_batch=16, seq_len=2048,
                              log_every=1, eval_every=20, save_every=10, keep_checkpoints=2,
                              loss_chunk_size=512)
  config.optimizer = optimizer_config(lr=lr, schedule="constant", warmup_steps=10,
                                      weight_decay=0.0, grad_clip=1.0)
  config.rollout.update(prompts_per_iteration=32, samples_per_prompt=4, max_new_tokens=1024,
                        max_batch=128)
  config.loss.update(loss or {})
  config.reward.normalize = "fixed"
  config.mesh = config_base.mesh_config(data=1, fsdp=-1, tensor=tensor)
  scorer_on_mesh(config, preset)
  config.require_weights = preset != "smollm2_135m"
  return config


def _genrm(config, big: bool):
  """A GenRM trained by GRPO on HelpSteer3 with NeMo-Aligner's verifier as the reward: the
  one-reward slot weighed alone, no normalisation, no steering."""
  config.algorithm = "grpo"
  config.scorer = scorer_section(source="genrm_verifier")
  config.scorer.weights.update({name: 0.0 for name in config.scorer.weights})
  config.scorer.weights.helpfulness = 1.0
  config.reward.normalize = "none"
  config.reward.steer_coef = 0.0
  config.prompts.update(format="genrm", sample_attributes="")
  # The export is the best greedy verifier reward on the held-out prompts, not the last
  # iteration's: a small judge's reward can fall back when a few answers break the format.
  config.train.update(export_best="reward", export_best_mode="max")
  if big:  # long prompts (two responses, guidelines) and answers (analyses, then boxes);
    # no KL term, so no reference is held beside the policy
    config.rollout.update(max_new_tokens=2048, samples_per_prompt=8, prompts_per_iteration=16)
    config.train.seq_len = 8192
    config.loss.beta = 0.0
    return config
  config.prompts.update(train_path=GENRM_DEMO_DATA, genrm_guidelines=False)
  config.init.source = GENRM_DEMO_POLICY
  config.optimizer.lr = 3e-4
  config.train.update(seq_len=512, num_steps=60, global_batch=32, micro_batch=32,
                      eval_every=10, save_every=10)
  config.rollout.update(prompts_per_iteration=8, samples_per_prompt=4, max_new_tokens=96)
  config.prompts.eval_limit = 32
  return config


def get_config(preset: str = ""):
  config = config_base.base_config("rl")
  config.algorithm = "grpo"  # a name in helpsteer_jax.rl.algorithms.REGISTRY
  config.prompts = _prompts()
  config.rollout = _rollout()
  config.loss = _loss()
  config.reward = _reward()
  config.teacher = _teacher()
  # The attribute model: demo_rules, an attribute_model workdir or its HF export, a serve
  # URL (/v1/rewards) or package.module:function; its predictions weighted by `weights`.
  config.scorer = scorer_section(source="demo_rules")
  config.scorer.weights.update(PPO_WEIGHTS)
  config.data = config_base.data_config()  # data.add_bos: the export's chat template
  # Requested attribute values: unset ones take the policy's own (its export's defaults).
  config.steer = steer_config()
  config.steer_attributes = ""
  if preset in ("", "demo"):
    return _demo(config)
  if preset == "smollm2_135m":
    return _big(config, "smollm2_135m", lr=1e-6, algorithm="grpo")
  if preset == "principle":
    return _principle(_demo(config))
  if preset == "llama3_8b":
    return _big(config, preset, lr=1e-7, algorithm="rloo", loss={"kl_coef": 3e-3})
  if preset == "llama3_70b":
    return _big(config, preset, lr=1e-7, algorithm="rloo", loss={"kl_coef": 3e-3}, tensor=8)
  if preset == "genrm":
    return _genrm(_demo(config), big=False)
  if preset == "genrm_llama3_70b":
    return _genrm(_big(config, "llama3_70b", lr=1e-7, algorithm="grpo", tensor=8), big=True)
  raise config_base.unknown_preset("rl", preset, PRESETS)
