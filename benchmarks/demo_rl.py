"""The RL guide's demo tables (docs/tasks/rl.md) from the runs' `summary.json`,
`metrics.jsonl` and greedy evaluations (`samples/`)."""

from __future__ import annotations

import statistics

from demo_runs import Outputs, distinct, duration, f

ALGORITHMS_HEADER = ("algorithm", "command", "iterations", "greedy reward before",
                     "after (evals at 10, 20, 30)", "KL (nats / completion)",
                     "steering distance before -> after", "distinct greedy answers at the end",
                     "extra", "wall")
OFF_POLICY_HEADER = ("run", "command", "greedy reward before", "after (evals at 10, 20, 30)",
                     "KL (nats / completion)", "extra", "s / iteration")
DISTILL_HEADER = ("`loss.reward_coef`", "greedy reward before", "after (evals at 10, 20, 30)",
                  "teacher KL per token, iteration 1", "iteration 40", "wall")
STEERING_HEADER = ("`reward.steer_coef`", "greedy reward before", "best", "after",
                   "eval steering distance before", "after")


class RLRun:
  """One RL run's figures: its summary, its iterations' metrics and its greedy evals."""

  def __init__(self, out: Outputs, run: str):
    self.out, self.run = out, run
    self.summary = out.json(run)
    metrics = out.metrics(run)
    self.train = [metrics[i] for i in sorted(metrics) if "reward" in metrics[i]]
    self.evals = {i: r for i, r in sorted(metrics.items()) if "eval_reward" in r}

  def command(self) -> str:
    return f"`{self.out.runs[self.run].commands[-1]}`"

  def before(self, key: str = "reward", digits: int = 3) -> str:
    return f(self.evals[min(self.evals)][f"eval_{key}"], digits)

  def after(self, key: str = "reward", digits: int = 3) -> str:
    return f(self.evals[max(self.evals)][f"eval_{key}"], digits)

  def after_with_evals(self) -> str:
    """`3.332 (2.656, 2.846, 3.257)`: the last eval, then those between the first and it."""
    first, last = min(self.evals), max(self.evals)
    inner = ", ".join(f(self.evals[i]["eval_reward"]) for i in self.evals if first < i < last)
    return f"{self.after()} ({inner})"

  def best(self) -> str:
    return f(max(r["eval_reward"] for r in self.evals.values()))

  def kl(self) -> str:
    return f(self.summary["train"].get("kl"), 2)

  def series(self, key: str) -> list[float]:
    return [r[key] for r in self.train if key in r]

  def distinct_answers(self) -> str:
    return distinct([s["response"] for s in self.out.samples(self.run, max(self.evals))])

  def clip(self) -> str:
    """`clip fraction up to 0.104` where a ratio was clipped (several epochs, off-policy)."""
    top = max(self.series("clip_fraction"), default=0.0)
    return f"clip fraction up to {top:.3f}" if top > 0 else ""

  def dynamic_sampling(self) -> str:
    """What dynamic sampling did: extra rounds, the share of groups dropped, fills."""
    rounds = self.series("dynamic_rounds")
    if not sum(rounds):
      return ""
    drops = self.series("dynamic_drop_rate")
    later = drops[1:] or drops
    return (f"{sum(rounds):.0f} extra rollout rounds ({min(rounds):.0f}-{max(rounds):.0f} per"
            f" iteration); groups dropped: {drops[0]:.0%} in iteration 1,"
            f" {100 * min(later):.0f}-{max(later):.0%} later;"
            f" {sum(self.series('dynamic_filled')):.0f} dropped groups kept to fill batches")

  def seconds_per_iteration(self) -> str:
    line = f"{statistics.median(self.series('iteration_s')):.1f}"
    waits = self.series("rollout_wait_s")
    return line + (f" ({min(waits):.1f}-{max(waits):.1f} waiting for rollouts)" if waits else "")


def _join(*parts: str) -> str:
  return "; ".join(p for p in parts if p)


def algorithm_rows(out: Outputs) -> list[list[str]]:
  """A row per RL run (the default GRPO run, then the demo's own), named after it."""
  rows = []
  for run in (n for n in out.runs if n != "acsft"):
    r = RLRun(out, run)
    label = "grpo (default)" if run == "rl" else run.replace("_", " ")
    rows.append([label, r.command(), str(r.summary["iteration"]), r.before(),
                 r.after_with_evals(), r.kl(),
                 f"{r.before('steer_distance', 2)} -> {r.after('steer_distance', 2)}",
                 r.distinct_answers(), _join(r.dynamic_sampling(), r.clip()),
                 duration(out.wall(run))])
  return rows


def _multi_turn(r: RLRun) -> str:
  turns = r.series("turns")
  rewards = r.series("reward")
  said = ("both turns answered in every rollout (`turns` 2.0)" if set(turns) == {2.0}
          else f"`turns` {statistics.mean(turns):.2f} on average")
  return (f"{said}; rollout reward {statistics.mean(rewards[:10]):.2f} over the first 10"
          f" iterations, {statistics.mean(rewards[-10:]):.2f} over the last 10")


def off_policy_rows(out: Outputs) -> list[list[str]]:
  rows = []
  for label, run, extra in (
      ("grpo (the default)", "rl", lambda r: r.clip()),
      ("grpo, one step off-policy", "off_policy",
       lambda r: _join("4 host devices train (FSDP 4), 4 sample; staleness 1 from iteration 2"
                       " on", r.clip())),
      ("grpo, multi-turn on MT-Bench", "multi_turn", _multi_turn)):
    r = RLRun(out, run)
    rows.append([label, r.command(), r.before(), r.after_with_evals(), r.kl(), extra(r),
                 r.seconds_per_iteration()])
  return rows


def distill_rows(out: Outputs) -> list[list[str]]:
  rows = []
  for coef in (0, 1):
    r = RLRun(out, f"distill_{coef}")
    kl = r.series("teacher_kl")
    rows.append([str(coef), r.before(), r.after_with_evals(), f(kl[0]), f(kl[-1]),
                 duration(out.wall(f"distill_{coef}"))])
  return rows


def steering_rows(out: Outputs) -> list[list[str]]:
  rows = []
  for coef in (0, 1):
    r = RLRun(out, f"steer_{coef}")
    rows.append([str(coef), r.before(), r.best(), r.after(), r.before("steer_distance", 2),
                 r.after("steer_distance", 2)])
  return rows
