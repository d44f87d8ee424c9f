"""Does steering steer? The default AC-SFT model answers the 50 held-out demo
prompts with one attribute changed at a time.

python benchmarks/steering.py [--acsft_workdir workdir/acsft]

Uses the default AC-SFT run's final checkpoint (runs
`python -m helpsteer_jax.main --config=configs/acsft.py` first when the
workdir has none) through the generate task's loader and prompt builder,
greedy decoding. Responses are scored by the rules that generated the demo
data (`data.demo.rule_scores`): verbosity from the sentence count,
correctness from the answer, complexity from the technical register.
Reports, per setting, the mean response length (words, sentences) and the
mean rule scores; plus best-of-4 (temperature 0.7) picked by the HelpSteer2
reward of the rule scores. Writes benchmarks/results/steering.json and the
README table.
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

from helpsteer_jax import runtime  # noqa: E402
from helpsteer_jax.data.demo import rows as demo  # noqa: E402
from helpsteer_jax.inference import attribute_scorer, best_of_n, steering  # noqa: E402
from helpsteer_jax.inference.sampling import SamplingConfig  # noqa: E402
from helpsteer_jax.tasks import generate  # noqa: E402

FIXED = dict(helpfulness=4, correctness=4, coherence=4, complexity=1, verbosity=2)
SWEEPS = (("verbosity", (0, 4)), ("correctness", (0, 4)), ("complexity", (1, 3)))


def ensure_acsft_run(workdir: pathlib.Path) -> None:
  if (workdir / "checkpoints").is_dir():
    return
  print(f"no AC-SFT checkpoint in {workdir}: running the default AC-SFT recipe")
  subprocess.run([sys.executable, "-m", "helpsteer_jax.main", "--config=configs/acsft.py",
                  f"--workdir={workdir}"], cwd=common.REPO, check=True)


def topic(prompt: str) -> str:
  return "math" if (" plus " in prompt or " times " in prompt) else (
      "capital" if "capital" in prompt else "list")


def evaluate(gen, prompts, attributes, max_new_tokens) -> dict:
  requests = [steering.make_request(p, attributes) for p in prompts]
  completions = gen.complete([r.prompt_text() for r in requests], max_new_tokens)
  responses = [steering.response_text(c.text, c.finish_reason) for c in completions]
  scores = [demo.rule_scores(p, r) for p, r in zip(prompts, responses)]
  return {
      "attributes": attributes,
      "mean_words": float(np.mean([len(r.split()) for r in responses])),
      "mean_sentences": float(np.mean([len(demo._sentences(r)) for r in responses])),
      "rule_scores": {k: float(np.mean([s[k] for s in scores])) for k in scores[0]},
      "correct_by_topic": {t: float(np.mean([s["correctness"] == 4 for p, s in
                                             zip(prompts, scores) if topic(p) == t]))
                           for t in ("math", "capital", "list")},
      "examples": responses[:3],
  }


def best_of_4(gen, prompts, max_new_tokens) -> dict:
  scorer = attribute_scorer.DemoRuleScorer()
  weights = best_of_n.weight_vector(best_of_n.HELPSTEER2_WEIGHTS)
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
  parser.add_argument("--tag", default="", help="suffix of the result file and README marker"
                      " (e.g. a longer AC-SFT run)")
  args = parser.parse_args()
  workdir = pathlib.Path(args.acsft_workdir).absolute()
  ensure_acsft_run(workdir)

  config = runpy.run_path(str(common.REPO / "configs" / "generate.py"))["get_config"]()
  config.checkpoint = str(workdir)
  config.batch_size = 16
  gen = generate.build_generator(config, runtime.setup(config), workdir)
  prompts = demo.heldout_prompts(args.prompts)

  sweeps = {}
  for name, values in SWEEPS:
    sweeps[name] = [evaluate(gen, prompts, {**FIXED, name: v}, args.max_new_tokens)
                    for v in values]
    for r in sweeps[name]:
      print(name, r["attributes"][name], {k: r[k] for k in ("mean_words", "mean_sentences")},
            r["rule_scores"])
  bon = best_of_4(gen, prompts, args.max_new_tokens)
  print("best-of-4", bon)
  result = {
      "benchmark": "steering", "acsft_workdir": str(workdir), "prompts": len(prompts),
      "fixed": FIXED, "sweeps": sweeps, "best_of_4": bon, "machine": common.machine()}
  suffix = f"_{args.tag}" if args.tag else ""
  common.write_result(f"steering{suffix}", result)
  write_table(result, "steering-benchmark" + suffix.replace("_", "-"))


def write_table(result: dict, marker: str) -> None:
  sweeps, bon = result["sweeps"], result["best_of_4"]

  def row(name, measure, fmt):
    low, high = sweeps[name]
    return [f"{name} {low['attributes'][name]} -> {high['attributes'][name]}", measure,
            fmt(low), fmt(high)]

  rows = [
      row("verbosity", "mean words", lambda r: f"{r['mean_words']:.1f}"),
      row("verbosity", "mean sentences", lambda r: f"{r['mean_sentences']:.2f}"),
      row("correctness", "answers correct (rule), all",
          lambda r: f"{100 * r['rule_scores']['correctness'] / 4:.0f}%"),
      *[row("correctness", f"answers correct (rule), {t}",
            lambda r, t=t: f"{100 * r['correct_by_topic'][t]:.0f}%")
        for t in ("list", "capital", "math")],
      row("complexity", "technical register (rule)",
          lambda r: f"{100 * (r['rule_scores']['complexity'] - 1) / 2:.0f}%"),
      ["best-of-4 (HelpSteer2 reward of rule scores)", "answers correct",
       f"{100 * bon['accuracy_single_sample']:.0f}% (one sample)",
       f"{100 * bon['accuracy_best']:.0f}% (best of 4)"],
  ]
  common.update_readme_table(marker, ["attribute", "measure", "low value", "high value"], rows)


if __name__ == "__main__":
  main()
