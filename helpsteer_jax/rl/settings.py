"""The RL task's settings, read from the config and checked before anything compiles."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import ml_collections

from helpsteer_jax.config_reads import NoEffect, Reads, Rule, any_given
from helpsteer_jax.data.records import STEERABLE
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.losses import sampler_correction
from helpsteer_jax.losses.policy_gradient import AGGREGATIONS
from helpsteer_jax.rl.algorithms import REGISTRY
from helpsteer_jax.rl.algorithms.base import Algorithm, LossSettings

NORMALIZATIONS = ("running", "fixed", "none")
ROLLOUT_DTYPES = ("float32", "bfloat16", "float16")
MULTI_TURN_REWARDS = ("final", "each")


@dataclasses.dataclass(frozen=True)
class RLSettings:
  """What every algorithm shares; `algorithm` carries its own typed settings."""
  algorithm: Algorithm
  prompts: int              # P per iteration
  k: int                    # completions per prompt
  max_new_tokens: int
  temperature: float
  top_p: float
  top_k: int
  eps_low: float
  eps_high: float
  aggregation: str
  truncation_penalty: float
  epochs: int
  updates_per_epoch: int    # optimizer steps per pass over a rollout batch
  normalize: str
  reward_mean: float
  reward_std: float
  steer_coef: float
  steer_attributes: tuple[str, ...]
  recompute_logprobs: bool
  sampler_correction: str = ""      # a `losses.sampler_correction` mode, or "" (off)
  sampler_correction_cap: float = 3.0
  rollout_dtype: str = ""           # the engine's dtype ("" = the policy's)
  track_kl: bool = False            # the reference's log-probs for the KL metric alone
  max_staleness: int = 0            # 1: rollouts sampled one update ahead (`rl.off_policy`)
  multi_turn: bool = False          # the policy answers every user turn (`rl.multiturn`)
  multi_turn_reward: str = "final"  # "final" or "each" answer scored
  unscored: str = ""                # why the reward source leaves a rollout unscored (NaN)

  def completion_width(self, seq_len: int) -> int:
    """T, the completion region of a rollout row: one answer's limit, or with multi-turn
    everything after the first prompt (later user turns and answers; a prompt holds at
    least one token)."""
    return seq_len - 1 if self.multi_turn else self.max_new_tokens

  @property
  def rows(self) -> int:
    """Completions per iteration."""
    return self.prompts * self.k

  @property
  def updates(self) -> int:
    """Optimizer steps per iteration."""
    return self.epochs * self.updates_per_epoch

  @property
  def uses_reference(self) -> bool:
    """Whether an iteration computes the reference's log-probabilities: for the
    algorithm's loss or reward, or for the `kl` metric alone (`loss.track_kl`)."""
    return self.algorithm.uses_reference or self.track_kl

  @property
  def loss(self) -> LossSettings:
    return LossSettings(self.eps_low, self.eps_high, self.aggregation, self.max_new_tokens,
                        bool(self.sampler_correction))

  @property
  def recomputes_old_logp(self) -> bool:
    """Whether the sampling policy's log-probs take a forward pass on the training path.

    Not needed with one optimizer step per rollout batch: the policy being trained is
    then the one that sampled, the importance ratio is exp(logp - stop_gradient(logp)),
    exactly 1, and the KL and entropy read the sampler's log-probs, which are the
    policy's at the sampling temperature when nothing truncates the distribution
    (top-p 1, top-k 0). TRL's GRPOTrainer skips the same pass in the same case.
    With rollouts sampled ahead (`max_staleness` 1) the pass runs on the rollout side,
    with the weights that sampled (`rl.off_policy`).
    """
    return (self.recompute_logprobs or self.algorithm.needs_old_logprobs
            or bool(self.sampler_correction) or self.max_staleness > 0
            or self.updates > 1 or self.top_p < 1.0 or self.top_k > 0)


def _fixed_moments(rc: ml_collections.ConfigDict) -> tuple[float, float]:
  if not rc.stats_path:
    return float(rc.mean), float(rc.std)
  path = pathlib.Path(rc.stats_path)
  try:
    stats = json.loads(path.read_text())
    return float(stats["mean"]), float(stats["std"])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"reward.stats_path={path}: expected a JSON object with numbers"
                      f" 'mean' and 'std' ({type(e).__name__}: {e})") from None


def read(config: ml_collections.ConfigDict) -> RLSettings:
  """The settings, or a ConfigError listing every problem and what to change."""
  settings, problems = _read(config)
  if problems:
    raise ConfigError("; ".join(problems))
  return settings


def _read(config: ml_collections.ConfigDict) -> tuple[RLSettings | None, list[str]]:
  """The settings (None with problems) and every problem, each naming its key."""
  ro, lc, rc, tc = config.rollout, config.loss, config.reward, config.train
  problems = []
  kind = REGISTRY.get(config.algorithm)
  if kind is None:
    problems.append(f"algorithm={config.algorithm!r}: choose one of {', '.join(REGISTRY)}")
    algorithm = None
  else:
    algorithm = kind.from_config(lc).resolved(int(ro.max_new_tokens))
    problems.extend(algorithm.problems())
  k, p = int(ro.samples_per_prompt), int(ro.prompts_per_iteration)
  if algorithm is not None:
    problems.extend(algorithm.rollout_problems(int(ro.max_new_tokens), k))
  correction = str(lc.get("sampler_correction", "") or "")
  cap = float(lc.get("sampler_correction_cap", 3.0))
  if correction and correction not in sampler_correction.MODES:
    problems.append(f"loss.sampler_correction={correction!r}: choose one of"
                    f" {', '.join(sampler_correction.MODES)} (or '' for none)")
  if not cap > 0:
    problems.append(f"loss.sampler_correction_cap={cap} must be > 0")
  rollout_dtype = str(ro.get("dtype", "") or "")
  if rollout_dtype not in ("", *ROLLOUT_DTYPES):
    problems.append(f"rollout.dtype={rollout_dtype!r}: choose one of {', '.join(ROLLOUT_DTYPES)}"
                    " (or '' for the policy's model.dtype)")
  staleness = int(ro.get("max_staleness", 0))
  if staleness not in (0, 1):
    problems.append(f"rollout.max_staleness={staleness}: 0 (on-policy) or 1 (each iteration's"
                    " rollouts sampled during the previous update); deeper pipelines are not"
                    " offered")
  if staleness and algorithm is not None and algorithm.dynamic_sampling_rounds:
    problems.append("rollout.max_staleness=1 with dynamic sampling: the extra rounds depend"
                    " on the first round's rewards and cannot be sampled ahead; set"
                    " loss.dynamic_sampling_rounds=0 or rollout.max_staleness=0")
  multi_turn = bool(ro.get("multi_turn", False))
  turn_reward = str(ro.get("multi_turn_reward", "final"))
  if turn_reward not in MULTI_TURN_REWARDS:
    problems.append(f"rollout.multi_turn_reward={turn_reward!r}: choose one of"
                    f" {', '.join(MULTI_TURN_REWARDS)}")
  if multi_turn and staleness:
    problems.append("rollout.multi_turn with rollout.max_staleness=1: the rollout side samples"
                    " one answer per prompt; set rollout.max_staleness=0 for multi-turn runs")
  if algorithm is not None and k < algorithm.min_samples:
    problems.append(f"rollout.samples_per_prompt={k}: {kind.name} compares each completion"
                    f" with the other samples of its prompt, so it needs at least"
                    f" {algorithm.min_samples}")
  if k < 1 or p < 1:
    problems.append("rollout.prompts_per_iteration and rollout.samples_per_prompt must be >= 1")
  rows = max(k, 1) * max(p, 1)
  if tc.global_batch < 1 or rows % tc.global_batch:
    problems.append(f"train.global_batch={tc.global_batch} (completions per optimizer step)"
                    f" must divide the {rows} completions of an iteration"
                    f" (rollout.prompts_per_iteration x rollout.samples_per_prompt)")
  if ro.max_new_tokens < 1 or ro.max_new_tokens >= tc.seq_len:
    problems.append(f"rollout.max_new_tokens={ro.max_new_tokens} must be in 1.."
                    f"{tc.seq_len - 1} (train.seq_len holds the prompt and the completion)")
  if not ro.temperature > 0:
    problems.append(f"rollout.temperature={ro.temperature}: RL samples, so it must be > 0")
  required = algorithm.required_aggregation if algorithm else None
  aggregation = required or lc.aggregation or (kind.default_aggregation if kind else "token")
  if aggregation not in AGGREGATIONS:
    problems.append(f"loss.aggregation={aggregation!r}: choose one of {', '.join(AGGREGATIONS)}")
  if required and lc.aggregation and lc.aggregation != required:
    problems.append(f"loss.aggregation={lc.aggregation!r}: these {kind.name} settings define"
                    f" the loss with {required!r}; leave it unset")
  eps_low, eps_high = kind.default_clip if kind else (0.2, 0.2)
  eps_low = eps_low if lc.get("eps_low") is None else float(lc.eps_low)
  eps_high = eps_high if lc.get("eps_high") is None else float(lc.eps_high)
  if not (0 <= eps_low < 1 and eps_high >= 0):
    problems.append(f"loss.eps_low={eps_low} must be in [0, 1) and loss.eps_high >= 0")
  if lc.epochs < 1:
    problems.append(f"loss.epochs={lc.epochs} must be >= 1")
  if rc.normalize not in NORMALIZATIONS:
    problems.append(f"reward.normalize={rc.normalize!r}: choose one of {NORMALIZATIONS}")
  mean, std = _fixed_moments(rc) if rc.normalize == "fixed" else (0.0, 1.0)
  if not (math.isfinite(mean) and math.isfinite(std) and std > 0):
    problems.append(f"the fixed reward normalisation needs a finite mean and a std > 0,"
                    f" got {mean}, {std}")
  steer = tuple(a.strip() for a in rc.steer_attributes.split(",") if a.strip())
  unknown = [a for a in steer if a not in STEERABLE]
  if unknown:
    problems.append(f"reward.steer_attributes: {unknown} are not steerable ({STEERABLE})")
  if problems:
    return None, problems
  return RLSettings(
      algorithm=algorithm, prompts=p, k=k, max_new_tokens=int(ro.max_new_tokens),
      temperature=float(ro.temperature), top_p=float(ro.top_p), top_k=int(ro.top_k),
      eps_low=eps_low, eps_high=eps_high, aggregation=aggregation,
      truncation_penalty=float(lc.truncation_penalty), epochs=int(lc.epochs),
      updates_per_epoch=rows // tc.global_batch, normalize=rc.normalize, reward_mean=mean,
      reward_std=std, steer_coef=float(rc.steer_coef), steer_attributes=steer,
      recompute_logprobs=bool(lc.get("recompute_logprobs", False)),
      sampler_correction=correction, sampler_correction_cap=cap, rollout_dtype=rollout_dtype,
      track_kl=bool(lc.get("track_kl", False)), max_staleness=staleness,
      multi_turn=multi_turn, multi_turn_reward=turn_reward), []


def _algorithm_problems(names: tuple[str, ...], field: str):
  """The problems the algorithms `names` find with `loss.<field>`'s value."""
  def problems(config) -> list[str]:
    out = []
    for name in names:
      try:
        algorithm = REGISTRY[name].from_config(config.loss)
      except (TypeError, ValueError) as e:
        out.append(f"loss.{field}={config.loss[field]!r}: {e}")
        continue
      out.extend(p for p in algorithm.problems() if p.startswith(f"loss.{field}="))
    return out
  return problems


def _problems_of(*keys: str):
  """The problems `read` finds with `keys`' values (checked where they are not read)."""
  def problems(config) -> list[str]:
    return [p for p in _read(config)[1] if p.startswith(tuple(f"{k}=" for k in keys))]
  return problems


def _clip_no_effect(config, given) -> str | None:
  """The clip range does nothing when every rollout batch is one optimizer step on the
  policy that sampled it: the ratio is then exactly 1 (`recomputes_old_logp`)."""
  kind = REGISTRY.get(config.algorithm)
  if kind is None or not (any_given(given, "loss.eps_low", "loss.eps_high")
                          or kind.default_clip != Algorithm.default_clip):
    return None
  try:
    s = read(config)
  except ConfigError:
    return None  # the run itself names the problem
  if s.updates > 1 or s.max_staleness:
    return None
  return (f"loss.eps_low / loss.eps_high ({s.algorithm.name}'s clip range {s.eps_low:g} /"
          f" {s.eps_high:g}) have no effect: each iteration is one optimizer step on the"
          f" policy that sampled (loss.epochs={s.epochs}, train.global_batch="
          f"{config.train.global_batch} of {s.rows} completions), so the ratio is 1; set"
          " loss.epochs > 1 or a smaller train.global_batch for the clip to act")


def _track_kl_no_effect(config, given) -> str | None:
  kind = REGISTRY.get(config.algorithm)
  if kind is None or not (any_given(given, "loss.track_kl") and config.loss.track_kl):
    return None
  try:
    uses = read(config).algorithm.uses_reference
  except ConfigError:
    return None
  return (f"loss.track_kl has no effect: algorithm={kind.name} computes the reference's"
          " log-probs for its own KL term already") if uses else None


def config_reads() -> list[Rule]:
  """The RL keys only some runs read (`config_reads`): each algorithm's own `loss.*`
  fields, found in the registry (a field every algorithm has is read by all), the
  teacher, the off-policy rollout devices, the fixed normalisation's moments, the judge
  prompt formats' options; and the settings that can have no effect."""
  readers: dict[str, list[str]] = {}
  for name in REGISTRY:
    for field in dataclasses.fields(REGISTRY[name]):
      readers.setdefault(field.name, []).append(name)
  rules: list[Rule] = []
  for field, names in readers.items():
    if len(names) < len(REGISTRY):
      chosen = tuple(names)
      rules.append(Reads((f"loss.{field}",), "algorithm", " or ".join(chosen),
                         lambda c, chosen=chosen: c.algorithm in chosen,
                         _algorithm_problems(chosen, field)))
  teacher = tuple(n for n in REGISTRY if REGISTRY[n].needs_teacher)
  genrm = lambda c: c.prompts.format == "genrm"  # noqa: E731
  rules += [
      Reads(("teacher",), "algorithm", " or ".join(teacher),
            lambda c: c.algorithm in teacher),
      Reads(("rollout.devices", "rollout.mesh"), "rollout.max_staleness", "1",
            lambda c: int(c.rollout.max_staleness) == 1),
      Reads(("rollout.multi_turn_reward",), "rollout.multi_turn", "true",
            lambda c: bool(c.rollout.multi_turn), _problems_of("rollout.multi_turn_reward")),
      Reads(("reward.mean", "reward.std", "reward.stats_path"), "reward.normalize", "fixed",
            lambda c: c.reward.normalize == "fixed"),
      Reads(("loss.sampler_correction_cap",), "loss.sampler_correction",
            "one of its modes", lambda c: bool(c.loss.sampler_correction),
            _problems_of("loss.sampler_correction_cap")),
      Reads(("prompts.feedback_path", "prompts.genrm_guidelines",
             "prompts.genrm_both_orders"), "prompts.format", "genrm", genrm),
      Reads(("prompts.domains", "prompts.languages"), "prompts.format",
            "genrm or principle (HelpSteer3's rows)",
            lambda c: c.prompts.format in ("genrm", "principle")),
      Reads(("prompts.demo_train_prompts",), "prompts.train_path", "'' (the demo prompts)",
            lambda c: not c.prompts.train_path and c.prompts.format == "jsonl"),
      NoEffect(_clip_no_effect),
      NoEffect(_track_kl_no_effect),
  ]
  return rules
