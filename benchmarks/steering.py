"""Does steering steer? The default AC-SFT model answers the 50 held-out demo prompts
with each of its five attributes at every value 0..4, the others fixed.

python benchmarks/steering.py [--acsft_workdir workdir/acsft] [--tag 600]

Uses the default AC-SFT run's final checkpoint (runs
`helpsteer-jax --config=configs/acsft.py` first when the
workdir has none) through the generate task's loader and the steering-sweep
library (`eval.steering_sweep`, what `configs/steering_sweep.py` runs),
greedy decoding. Responses are scored by the rules that generated the demo
data (`data.demo.rule_scores`, the `demo_rules` scorer): verbosity from the
sentence count, correctness from the answer, complexity from the technical
register. Reports, per setting, the mean response length (words, sentences,
tokens), the mean rule scores and the share of correct answers per topic;
plus best-of-4 (temperature 0.7) picked by the HelpSteer2 reward of the rule
scores. Writes benchmarks/results/steering.json, the tables in docs/results.md and the
sweep's figure, docs/steering_sweep.png (with `--tag`, suffixed).
"""

from __future__ import annotations

import argparse
import pathlib
import runpy
import subprocess
import sys

import common

common.setup_cpu_process()

import numpy as np  # noqa: E402

from helpsteer_jax import config_sections, runtime  # noqa: E402
from helpsteer_jax.data.demo import rows as demo  # noqa: E402
from helpsteer_jax.eval import steering_sweep as sweep_lib  # noqa: E402
from helpsteer_jax.eval import sweep_report  # noqa: E402
from helpsteer_jax.inference import best_of_n, steering  # noqa: E402
from helpsteer_jax.inference.sampling import SamplingConfig  # noqa: E402
from helpsteer_jax.runs import generation  # noqa: E402
from helpsteer_jax.scoring import rewards, rules  # noqa: E402
from helpsteer_jax.scoring.scorer import HostScorer  # noqa: E402

FIXED = dict(helpfulness=4, correctness=4, coherence=4, complexity=1, verbosity=2)
TOPICS = ("list", "capital", "math")


def ensure_acsft_run(workdir: pathlib.Path) -> None:
  if (workdir / "checkpoints").is_dir():
    return
  print(f"no AC-SFT checkpoint in {workdir}: running the default AC-SFT recipe")
  subprocess.run([sys.executable, "-m", "helpsteer_jax.main", "--config=configs/acsft.py",
                  f"--workdir={workdir}"], cwd=common.REPO, check=True)


def topic(prompt: str) -> str:
  return "math" if (" plus " in prompt or " times " in prompt) else (
      "capital" if "capital" in prompt else "list")


def sweep(gen, prompts, batch_size: int, max_new_tokens: int) -> dict:
  """The sweep's summary, each setting with its per-topic correctness and two examples."""
  grid = sweep_lib.settings(FIXED, tuple(FIXED))
  requests = sweep_lib.sweep_requests([steering.make_request(p, FIXED) for p in prompts], grid)
  scorer = HostScorer(rules.demo_rule_scores)
  rows = []
  for start in range(0, len(requests), batch_size):
    rows += sweep_lib.answer_rows(gen, requests[start:start + batch_size], max_new_tokens,
                                  SamplingConfig(), start, scorer)
  summary = sweep_lib.summarize(rows, grid)
  for name, entries in summary["sweeps"].items():
    for entry in entries:
      mine = [r for r in rows if (r["sweep_attribute"], r["sweep_value"]) == (name, entry["value"])]
      entry["correct_by_topic"] = {
          t: float(np.mean([demo.rule_correct(r["prompt"], r["response"]) is True
                            for r in mine if topic(r["prompt"]) == t])) for t in TOPICS}
      entry["examples"] = [r["response"] for r in mine[:2]]
  return summary


def best_of_4(gen, prompts, max_new_tokens) -> dict:
  scorer = HostScorer(rules.demo_rule_scores)
  weights = rewards.weight_vector(config_sections.HELPSTEER2_WEIGHTS)
  correct_best, correct_any, correct_mean = [], [], []
  requests = [steering.make_request(p, FIXED) for p in prompts]
  results = []
  for start in range(0, len(requests), 4):  # 4 prompts x 4 samples per batch
    results += best_of_n.best_of_n(gen, requests[start:start + 4], 4, scorer, weights,
                                   max_new_tokens, SamplingConfig(temperature=0.7), seed=start)
  for p, result in zip(prompts, results):
    flags = [demo.rule_correct(p, c.response) is True for c in result.candidates]
    correct_best.append(flags[result.best])
    correct_any.append(any(flags))
    correct_mean.append(np.mean(flags))
  return {"n": 4, "temperature": 0.7, "accuracy_best": float(np.mean(correct_best)),
          "accuracy_single_sample": float(np.mean(correct_mean)),
          "any_correct": float(np.mean(correct_any))}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--acsft_workdir", default=str(common.REPO / "workdir" / "acsft"))
  parser.add_argument("--prompts", type=int, default=50)
  parser.add_argument("--max_new_tokens", type=int, default=128)
  parser.add_argument("--tag", default="", help="suffix of the result file, the docs/results.md"
                      " markers and the figure (e.g. a longer AC-SFT run)")
  args = parser.parse_args()
  workdir = pathlib.Path(args.acsft_workdir).absolute()
  ensure_acsft_run(workdir)

  config = runpy.run_path(str(common.REPO / "configs" / "steering_sweep.py"))["get_config"]()
  config.init.source = str(workdir)
  config.batch_size = 16
  gen = generation.build_generator(config, runtime.setup(config), workdir)
  prompts = demo.heldout_prompts(args.prompts)

  summary = sweep(gen, prompts, config.batch_size, args.max_new_tokens)
  print(sweep_report.table(summary))
  bon = best_of_4(gen, prompts, args.max_new_tokens)
  print("best-of-4", bon)
  suffix = f"_{args.tag}" if args.tag else ""
  figure = common.REPO / "docs" / f"steering_sweep{suffix}.png"
  sweep_report.plot(summary, figure, f"AC-SFT demo model ({workdir.name}), {len(prompts)}"
                    " held-out prompts; predicted = the demo rules' scores")
  result = {
      "benchmark": "steering", "acsft_workdir": str(workdir), "prompts": len(prompts),
      "fixed": FIXED, "max_new_tokens": args.max_new_tokens, "sweep": summary,
      "best_of_4": bon, "figure": str(figure.relative_to(common.REPO)),
      "machine": common.machine()}
  common.write_result(f"steering{suffix}", result)
  write_tables(result, suffix.replace("_", "-"))


def write_tables(result: dict, marker_suffix: str) -> None:
  sweeps, bon = result["sweep"]["sweeps"], result["best_of_4"]

  def row(name, measure, fmt):
    return [name, measure] + [fmt(e) for e in sweeps[name]]

  percent = lambda x: f"{100 * x:.0f}%"
  words = lambda name: row(name, "mean words", lambda e: f"{e['mean_words']:.1f}")
  rule = lambda name: row(name, f"{name} (rule)", lambda e: f"{e['predicted'][name]:.2f}")
  rows = [words("verbosity"),
          row("verbosity", "mean sentences", lambda e: f"{e['mean_sentences']:.2f}"),
          rule("verbosity"),
          words("correctness"),
          row("correctness", "answers correct (rule), all",
              lambda e: percent(e["predicted"]["correctness"] / 4)),
          *[row("correctness", f"answers correct (rule), {t}",
                lambda e, t=t: percent(e["correct_by_topic"][t])) for t in TOPICS],
          words("complexity"),
          row("complexity", "technical register (rule)",
              lambda e: percent((e["predicted"]["complexity"] - 1) / 2)),
          words("coherence"), rule("coherence"), words("helpfulness"), rule("helpfulness")]
  values = [str(v) for v in result["sweep"]["values"]]
  common.update_doc_table("steering-benchmark" + marker_suffix,
                             ["attribute", "measure", *values], rows)
  common.update_doc_table("steering-best-of-4" + marker_suffix,
                             ["answers correct (rule)", "one sample", "best of 4"],
                             [["best-of-4, HelpSteer2 reward of rule scores",
                               percent(bon["accuracy_single_sample"]),
                               percent(bon["accuracy_best"])]])


if __name__ == "__main__":
  main()
