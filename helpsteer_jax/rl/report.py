"""The RL run's report: its greedy evaluations' figures and its curves (reward and KL
against the iteration, as a PNG)."""

from __future__ import annotations

import json
import pathlib

from helpsteer_jax import processes


def read_metrics(workdir: str | pathlib.Path) -> list[dict]:
  """metrics.jsonl's records (a line cut short by a kill is skipped)."""
  path = pathlib.Path(workdir) / "metrics.jsonl"
  out = []
  if path.exists():
    for line in path.read_text(encoding="utf-8").splitlines():
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return out


def eval_rewards(records: list[dict], name: str = "reward") -> dict[int, float]:
  """{iteration: the greedy eval's `name` (reward, steer_distance, ...)}, the last record
  of each iteration winning."""
  return {r["step"]: r[f"eval_{name}"] for r in records if f"eval_{name}" in r}


# What a summary compares between the first and the last greedy evaluation, when the
# evaluation reports it (rl.evaluation.reported): the reward, and the steering distance
# (an attribute model's) or the judge's unreadable answers (a judge's).
COMPARED = ("reward", "steer_distance", "parse_failures")


def first_and_last(records: list[dict]) -> dict[str, float]:
  """`eval_<name>_before` (iteration 0) and `_after` (the last evaluation) for each of
  `COMPARED` the evaluations report; the reward's always (NaN without evaluations)."""
  out = {}
  for name in COMPARED:
    by_step = eval_rewards(records, name)
    if by_step or name == "reward":
      out[f"eval_{name}_before"] = by_step.get(0, float("nan"))
      out[f"eval_{name}_after"] = by_step[max(by_step)] if by_step else float("nan")
  return out


def progress_line(records: list[dict], prompts: int) -> str:
  """The greedy evals' first and last reward and what else they compare, with their
  iterations: `greedy reward on N held-out prompts 2.226 (iteration 0) -> 3.332
  (iteration 40); steering distance 1.640 -> 2.220`; a judge's: `greedy verifier reward
  ...; unparsed answers 0.0% -> 6.9%`."""
  rewards = eval_rewards(records)
  if not rewards:
    return "no greedy evaluation yet"
  first, last = min(rewards), max(rewards)
  failures = eval_rewards(records, "parse_failures")
  what = "greedy verifier reward" if failures else "greedy reward"
  line = f"{what} on {prompts} held-out prompts {rewards[first]:.3f} (iteration {first})"
  line += (f" -> {rewards[last]:.3f} (iteration {last})" if last != first
           else ", not evaluated since")
  distance = eval_rewards(records, "steer_distance")
  if first in failures and last in failures and last != first:
    line += f"; unparsed answers {failures[first]:.1%} -> {failures[last]:.1%}"
  elif first in distance and last in distance and last != first:
    line += f"; steering distance {distance[first]:.3f} -> {distance[last]:.3f}"
  return line


def plot_curves(workdir: str | pathlib.Path) -> pathlib.Path | None:
  """Process 0 writes `<workdir>/rl_curves.png` (rollout reward, greedy eval reward, KL)."""
  records = read_metrics(workdir)
  train = {r["step"]: r for r in records if "reward" in r}
  if not processes.is_primary() or not train:
    return None
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  steps = sorted(train)
  evals = eval_rewards(records)
  fig, (ax_r, ax_kl) = plt.subplots(1, 2, figsize=(10, 3.8))
  ax_r.plot(steps, [train[s]["reward"] for s in steps], label="rollouts (sampled)")
  ax_r.plot(sorted(evals), [evals[s] for s in sorted(evals)], "o-", label="eval (greedy)")
  ax_r.set(xlabel="iteration", ylabel="reward", title="weighted attribute reward")
  ax_r.legend()
  ax_kl.plot(steps, [train[s].get("kl", float("nan")) for s in steps])
  ax_kl.set(xlabel="iteration", ylabel="KL (nats per completion)",
            title="KL to the reference" if any("kl" in train[s] for s in steps)
            else "KL to the reference (not computed: loss.track_kl)")
  fig.tight_layout()
  out = pathlib.Path(workdir) / "rl_curves.png"
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out
