"""The guides' demos whose tables `demo_figures.py` regenerates: one `Demo` per demo, its
commands as the guide gives them, and how each table's rows come from what they wrote.

A table's rows are built from the tasks' own files (`summary.json`, `metrics.jsonl`,
`rm_report.json`, the RL evaluations' `samples/`, iterative DPO's and SteerLM 2.0's round
directories), in the guide's column layout. Every command here is one of its guide's (the
tests check that each appears there and parses as a run main.py would start).
"""

from __future__ import annotations

import statistics
from typing import Callable

import demo_rl
from demo_runs import Demo, Outputs, Run, Table, distinct, f

from helpsteer_jax.judges import principle

ATTRIBUTES = ("helpfulness", "correctness", "coherence", "complexity", "verbosity")
SHARED_DATA = "../shared/data"  # the default --data: HelpSteer2's first rows, MT-Bench


def _smollm2_missing() -> str | None:
  from helpsteer_jax.pretrained import smollm2
  try:
    smollm2.check_installed()
  except smollm2.MissingPackageError as e:
    return str(e)
  return None


# ------------------------------------------------------------------- prerequisites

RL = "helpsteer-jax --config=configs/rl.py"
PREREQUISITES = {r.name: r for r in (
    Run("acsft", ("helpsteer-jax --config=configs/acsft.py",), minutes=4),
    Run("rl", (RL,), needs=("acsft",), minutes=5),  # the default GRPO run
    Run("attribute_model", ("helpsteer-jax --config=configs/attribute_model.py",), minutes=4),
)}


def _rl(name: str, flags: str, minutes: float = 5, **kw) -> Run:
  return Run(name, (f"{RL} {flags}",), needs=("acsft",), minutes=minutes, **kw)


# ------------------------------------------------------------------- iterative DPO

def _iterative_dpo_rows(out: Outputs) -> list[list[str]]:
  summary = out.json("iterative_dpo")
  rows = []
  for r, reward in sorted(summary["eval_reward"].items(), key=lambda kv: int(kv[0])):
    rdir = out.workdir("iterative_dpo") / f"iteration_{r}"
    answers = out.json("iterative_dpo", f"iteration_{r}/eval.json")["answers"]
    pairs = rdir / "pairs.jsonl"
    attributes = summary["eval_attributes"][r]
    rows.append(["0 (AC-SFT)" if r == "0" else r, f(reward)]
                + [f(attributes[a], 2) for a in ATTRIBUTES]
                + [str(len(pairs.read_text().splitlines())) if pairs.exists() else "-",
                   distinct([a["response"] for a in answers])])
  return rows


# ------------------------------------------------------------------- SteerLM 2.0

def _adherence_rows(key: str, run: str = "steerlm2"):
  def rows(out: Outputs) -> list[list[str]]:
    return [[label] + [f(errors.get(a)) for a in (*ATTRIBUTES, "mean")]
            for label, errors in out.json(run)[key].items()]
  return rows


def _steerlm2_settings_rows(out: Outputs) -> list[list[str]]:
  rows = []
  for label, run in (("unconditional model: the AC-SFT policy without the label", "unlabelled"),
                     ("lr 2e-4, 4 responses", "lr_2e-4")):
    means = [errors["mean"] for errors in out.json(run)["adherence"].values()]
    rows.append([label, f"`{out.runs[run].commands[-1]}`"] + [f(m) for m in means])
  return rows


# ------------------------------------------------------------------- the attribute model

def _variants_rows(out: Outputs) -> list[list[str]]:
  variants = out.json("variants", "rm_report.json")["variants"]
  def counted(figure: float | None, count: int | None) -> str:
    return f"{f(figure)} ({count})"  # the pairs judged, so that NaN over none reads so

  rows = []
  for name, v in variants.items():
    pref, bench = v["helpsteer2_preference"], v["rewardbench"]
    rows.append([name, v["reward"], counted(pref["accuracy"], pref["count"])]
                + [counted(bench["sections"].get(s), bench["section_counts"].get(s))
                   for s in ("Chat", "Chat Hard", "Reasoning", "Score")])
  return rows


HEAD_BIAS = "--config.head_bias=True --config.train.export_hf=False"


def _head_bias_rows(out: Outputs) -> list[list[str]]:
  rows = []
  for label, run in (("no bias (the default)", "attribute_model"), ("bias", "head_bias"),
                     ("bias, 300 steps", "head_bias_300")):
    summary = out.json(run)
    pearson = summary["validation"]["attributes"]
    rows.append([label, f"`{out.runs[run].commands[-1]}`"]
                + [f(pearson[a]["pearson"]) for a in ATTRIBUTES] + [f(summary["train"]["loss"])])
  return rows


# ------------------------------------------------------------------- generative judges

def judge_tables(prefix: str, run: str, iterations: int, eval_every: int, penalty: float,
                 failures: str = "parse failures",
                 right: Callable[[dict], bool] | None = None) -> tuple[Table, Table]:
  """A generative judge's demo trained by RL (the GenRM's, the principle judge's): the
  rollouts' mean reward per `eval_every` iterations (`<prefix>-rollouts`), and at each
  evaluation the greedy answers' mean reward, how many got `penalty`, the reward of an
  answer the verifier cannot read, and, given `right` (a sample -> whether its verdict is
  the truth), how many judged right (`<prefix>-held-out`)."""
  spans = [(i + 1, i + eval_every) for i in range(0, iterations, eval_every)]
  evals = range(0, iterations + 1, eval_every)

  def rollouts(out: Outputs) -> list[list[str]]:
    m = out.metrics(run)
    return [["mean reward"] + [f(statistics.mean(m[i]["reward"] for i in range(a, b + 1)), 1)
                               for a, b in spans]]

  def held_out(out: Outputs) -> list[list[str]]:
    m = out.metrics(run)
    counts = [sum(s["reward"] <= penalty for s in out.samples(run, i)) for i in evals]
    count = len(out.samples(run, 0))
    rows = [[f"greedy mean reward ({count} held-out prompts)"]
            + [f(m[i]["eval_reward"], 2) for i in evals],
            [failures] + [str(n) for n in counts]]
    if right is not None:
      rows.append(["verdicts that match the truth"]
                  + [str(sum(map(right, out.samples(run, i)))) for i in evals])
    return rows

  return (Table(f"{prefix}-rollouts", ("iterations", *(f"{a}-{b}" for a, b in spans)),
                rollouts),
          Table(f"{prefix}-held-out", ("iteration", *map(str, evals)), held_out))


GENRM_COMMANDS = (
    "python -m helpsteer_jax.runs.genrm_prompts workdir/genrm_demo",
    "helpsteer-jax --config=configs/acsft.py --workdir=workdir/acsft_genrm"
    " --config.data.train_path=workdir/genrm_demo/format_sft"
    " --config.data.validation_path=workdir/genrm_demo/format_sft"
    " --config.train.seq_len=512 --config.train.num_steps=65",
    "helpsteer-jax --config=configs/rl.py:genrm --workdir=workdir/rl_genrm",
)

PRINCIPLE_COMMANDS = (
    "python -m helpsteer_jax.runs.principle_demo workdir/principle_demo",
    "helpsteer-jax --config=configs/acsft.py --workdir=workdir/acsft_principle"
    " --config.data.train_path=workdir/principle_demo/format_sft"
    " --config.data.validation_path=workdir/principle_demo/format_sft"
    " --config.train.seq_len=512 --config.train.num_steps=80",
    "helpsteer-jax --config=configs/rl.py:principle --workdir=workdir/rl_principle",
)


def _principle_right(sample: dict) -> bool:
  verdict = principle.parse_judgement(sample["response"])
  return verdict is not None and verdict == (sample["reference"]["fulfilment"] == "Yes")


# ------------------------------------------------------------------- SmolLM2 RL

SMOLLM2_COMMANDS = (
    "head -n 80 train_first100.jsonl > train80.jsonl",
    "tail -n 20 train_first100.jsonl > val20.jsonl",
    "helpsteer-jax --config=attribute_model --config.model.name=smollm2_135m"
    " --config.model.hidden_size=576 --config.model.intermediate_size=1536"
    " --config.model.num_layers=30 --config.model.num_heads=9 --config.model.num_kv_heads=3"
    " --config.init.source=$SMOL --config.data.train_path=train80.jsonl"
    " --config.data.validation_path=val20.jsonl --config.train.seq_len=1024"
    " --config.train.global_batch=4 --config.train.micro_batch=4 --config.train.num_steps=10"
    " --config.optimizer.lr=1e-4 --config.optimizer.warmup_steps=1 --workdir=am",
    "helpsteer-jax --config=rl:smollm2_135m --config.init.source=$SMOL --config.scorer.source=am"
    " --config.prompts.train_path=train80.jsonl --config.prompts.eval_path=val20.jsonl"
    " --config.rollout.prompts_per_iteration=4 --config.rollout.samples_per_prompt=4"
    " --config.rollout.max_new_tokens=48 --config.train.seq_len=192"
    " --config.train.global_batch=16 --config.train.micro_batch=16 --config.train.num_steps=6"
    " --config.train.eval_every=3 --config.model.dtype=float32"
    " --config.scorer.model.dtype=float32 --config.scorer.model.param_dtype=float32"
    " --config.optimizer.lr=2e-5 --workdir=rl",
)


def _smollm2_reward_model_rows(out: Outputs) -> list[list[str]]:
  metrics = out.json("smollm2", command=0)["validation"]["attributes"]
  count = metrics[ATTRIBUTES[0]]["count"]
  return [[f"{name} ({count} held-out rows)"] + [f(metrics[a][key], 2) for a in ATTRIBUTES]
          for name, key in (("Pearson r", "pearson"), ("MAE", "mae"))]


def _smollm2_rows(out: Outputs) -> list[list[str]]:
  m = out.metrics("smollm2")
  rows = []
  for i in (0, 1, 3, 5, 6):
    r = m.get(i, {})
    train = (["-"] * 5 if "reward" not in r else
             [f"{f(r['reward'])}, {f(r['reward_std'])}", f(r.get("kl"), 2), f(r["entropy"], 2),
              f(r["response_length"], 1), f"{r['truncated']:.0%}"])
    greedy = ([f(r["eval_reward"]), f(r["eval_response_length"], 0)] if "eval_reward" in r
              else ["-", "-"])
    rows.append([str(i)] + train + greedy)
  return rows


# ------------------------------------------------------------------- the registry

DEMOS: tuple[Demo, ...] = (
    Demo("rl-algorithms", "docs/tasks/rl.md", (
        _rl("rloo", "--config.algorithm=rloo --config.optimizer.lr=1e-4"),
        _rl("ppo", "--config.algorithm=ppo", minutes=7),
        _rl("gspo", "--config.algorithm=gspo --config.loss.epochs=2 --config.loss.track_kl=true",
            minutes=6),
        _rl("dapo", "--config.algorithm=dapo --config.loss.track_kl=true", minutes=12),
        _rl("dapo_without_dynamic_sampling", "--config.algorithm=dapo"
            " --config.loss.dynamic_sampling_rounds=0 --config.loss.track_kl=true"),
    ), (Table("rl-algorithms", demo_rl.ALGORITHMS_HEADER, demo_rl.algorithm_rows,
              timing=("wall",)),), uses=("rl",)),
    Demo("rl-off-policy", "docs/tasks/rl.md", (
        Run("off_policy", ("XLA_FLAGS=--xla_force_host_platform_device_count=8"
                           f" {RL} --config.rollout.max_staleness=1 --config.mesh.data=1"
                           " --workdir=workdir/rl_off_policy",),
            needs=("acsft",), minutes=7),
        _rl("multi_turn", "--config.rollout.multi_turn=true"
            " --config.prompts.train_path=data/mt_bench/question.jsonl --config.train.seq_len=512"
            " --workdir=workdir/rl_multi_turn",
            minutes=16, inputs={"data/mt_bench/question.jsonl": "mt_bench/question.jsonl"}),
    ), (Table("rl-off-policy", demo_rl.OFF_POLICY_HEADER, demo_rl.off_policy_rows,
              timing=("s / iteration",)),), uses=("rl",)),
    Demo("rl-distill", "docs/tasks/rl.md", tuple(
        _rl(f"distill_{coef}", "--config.algorithm=distill --config.teacher.source=workdir/acsft"
            " --config.init.step=100 --config.optimizer.lr=1e-4" + flags, minutes=4)
        for coef, flags in ((0, ""), (1, " --config.loss.reward_coef=1"
                                         " --workdir=workdir/rl_distill_reward"))),
        (Table("rl-distill", demo_rl.DISTILL_HEADER, demo_rl.distill_rows, timing=("wall",)),)),
    Demo("rl-steering", "docs/tasks/rl.md", tuple(
        _rl(f"steer_{coef}", "--config.prompts.sample_attributes=complexity,verbosity" + flags)
        for coef, flags in ((0, " --workdir=workdir/rl_unsteered"),
                            (1, " --config.reward.steer_coef=1 --workdir=workdir/rl_steered"))),
        (Table("rl-steering", demo_rl.STEERING_HEADER, demo_rl.steering_rows),)),
    Demo("rl-smollm2", "docs/tasks/rl.md", (
        Run("smollm2", SMOLLM2_COMMANDS,
            inputs={"train_first100.jsonl": "helpsteer2/train_first100.jsonl"},
            exports={"SMOL": "python -m helpsteer_jax.pretrained.smollm2"},
            requires=_smollm2_missing, minutes=35),
    ), (Table("rl-smollm2-reward-model", ("", *ATTRIBUTES), _smollm2_reward_model_rows),
        Table("rl-smollm2", ("iteration", "rollout reward (mean, std)", "KL / completion",
                             "entropy", "response tokens", "cut at the limit",
                             "greedy reward (held-out prompts)", "greedy response tokens"),
              _smollm2_rows))),
    Demo("genrm", "docs/tasks/genrm.md", (Run("genrm", GENRM_COMMANDS, minutes=10),),
         judge_tables("genrm", "genrm", iterations=60, eval_every=10, penalty=-100.0)),
    Demo("principle-rm", "docs/tasks/principle_rm.md",
         (Run("principle_rm", PRINCIPLE_COMMANDS, minutes=10),),
         judge_tables("principle-rm", "principle_rm", iterations=60, eval_every=10,
                      penalty=-50.0, failures="answers without a verdict",
                      right=_principle_right)),
    Demo("attribute-model-variants", "docs/tasks/attribute_model.md", (
        Run("variants", (
            "helpsteer-jax --config=configs/attribute_model.py:demo_scaled_bt",
            "helpsteer-jax --config=configs/expo.py",
            "helpsteer-jax --config=configs/evaluate_rm.py --workdir=workdir/evaluate_rm_variants"
            " --config.variants=regression=workdir/attribute_model,"
            "regression_helpfulness=workdir/attribute_model@helpfulness,"
            "scaled_bt=workdir/attribute_model_bt@helpfulness,"
            "expo_0.1=workdir/expo/alpha_0.1@helpfulness,"
            "expo_0.3=workdir/expo/alpha_0.3@helpfulness,"
            "expo_0.5=workdir/expo/alpha_0.5@helpfulness"), needs=("attribute_model",),
            minutes=6),
    ), (Table("attribute-model-variants",
              ("variant", "reward", "HelpSteer2-Preference", "RB Chat", "RB Chat Hard",
               "RB Reasoning", "RB Score"), _variants_rows),)),
    Demo("attribute-model-head-bias", "docs/tasks/attribute_model.md", (
        Run("head_bias", (f"helpsteer-jax --config=configs/attribute_model.py {HEAD_BIAS}",),
            minutes=4),
        Run("head_bias_300", ("helpsteer-jax --config=configs/attribute_model.py"
                              f" {HEAD_BIAS} --config.train.num_steps=300",), minutes=6),
    ), (Table("attribute-model-head-bias",
              ("head", "command", *ATTRIBUTES, "final training loss"), _head_bias_rows),),
        uses=("attribute_model",)),
    Demo("iterative-dpo", "docs/tasks/iterative_dpo.md", (
        Run("iterative_dpo", ("helpsteer-jax --config=configs/iterative_dpo.py",),
            needs=("acsft",), minutes=5),
    ), (Table("iterative-dpo", ("iteration", "greedy reward", *ATTRIBUTES, "pairs",
                                "distinct answers"), _iterative_dpo_rows),)),
    Demo("steerlm2", "docs/tasks/steerlm2.md", (
        Run("steerlm2", ("helpsteer-jax --config=configs/steerlm2.py",), needs=("acsft",),
            minutes=8),
    ), (Table("steerlm2-requests", ("model", *ATTRIBUTES, "mean"), _adherence_rows("adherence")),
        Table("steerlm2-sweeps", ("model", *ATTRIBUTES, "mean"),
              _adherence_rows("sweep_adherence"))),
        images={"docs/steerlm2_adherence.png": ("steerlm2", "workdir/steerlm2/adherence.png")}),
    Demo("steerlm2-settings", "docs/tasks/steerlm2.md", (
        Run("unlabelled", ("helpsteer-jax --config=configs/steerlm2.py"
                           " --config.unconditional.with_label=false",), needs=("acsft",),
            minutes=8),
        Run("lr_2e-4", ("helpsteer-jax --config=configs/steerlm2.py --config.optimizer.lr=2e-4"
                        " --config.sampling.responses=4",), needs=("acsft",), minutes=6),
    ), (Table("steerlm2-settings", ("setting", "command", "AC-SFT", "iteration 1", "iteration 2"),
              _steerlm2_settings_rows),)),
)


def demos_by_name() -> dict[str, Demo]:
  return {d.name: d for d in DEMOS}
