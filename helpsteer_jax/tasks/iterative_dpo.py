"""Iterative DPO (HelpSteer2 paper): sample, pick best and worst by reward, DPO; repeat.

Each round (`runs.rounds`) samples `sampling.responses` answers per prompt with
the round's policy (temperature 0.7, top-p 0.9 by default), scores them with the
attribute model's weighted reward (`inference.best_of_n`, the rows in
`iteration_<r>/samples.jsonl`), pairs each prompt's best against its worst
(prompts whose answers all score the same are dropped) in
`iteration_<r>/pairs.jsonl` (prompt / chosen / rejected, TRL's format), and
trains the dpo2d task's sequence-level loss on them, its reference the round's
starting policy. Before round 1 and after every round the greedy answers to the
held-out prompts are scored; the summary lists their mean reward per round.
"""

from __future__ import annotations

import json
import pathlib

import ml_collections
import numpy as np
from absl import logging

from helpsteer_jax import processes
from helpsteer_jax.data import template
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.records import HELPSTEER_ATTRIBUTES
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import best_of_n, sample_score, steering
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.load import model as loader
from helpsteer_jax.losses.dpo2d import SEQUENCE_LOSSES
from helpsteer_jax.resume import append_batches
from helpsteer_jax.runs import policy, preference, prompts, rounds
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib
from helpsteer_jax.scoring import rewards as scoring_rewards
from helpsteer_jax.scoring.load import load_scorer, scorer_reads
from helpsteer_jax.train import loop

RESUMES = True  # a rerun resumes the workdir's run (main.py checks its fingerprint)


def config_reads() -> list:
  """The keys only some runs read: the pair loss's and the scorer's."""
  return preference.config_reads() + scorer_reads()

SAMPLES, PAIRS, EVAL = "samples.jsonl", "pairs.jsonl", "eval.json"
# A round's step is dpo2d's (whole-response pairs, the configured reference mode).
batch_schema = preference.batch_schema
abstract_train_step = preference.abstract_train_step


def check(config: ml_collections.ConfigDict) -> None:
  """Every setting problem, before anything loads."""
  rounds.check(config)
  problems = []
  if config.sampling.responses < 2:
    problems.append("sampling.responses must be at least 2 (a pair is the best and the worst)")
  if config.loss.loss_type not in SEQUENCE_LOSSES:
    problems.append(f"loss.loss_type={config.loss.loss_type!r}: sampled pairs have no segment"
                    f" scores; choose one of {SEQUENCE_LOSSES}")
  if config.sampling.temperature <= 0:
    problems.append("sampling.temperature must be > 0 (greedy answers are all the same)")
  if config.sampling.batch_prompts < 1:
    problems.append("sampling.batch_prompts must be at least 1")
  if config.prompts.system != template.DEFAULT_SYSTEM:
    problems.append("prompts.system: DPO's pair rows use the default system prompt; leave it")
  if problems:
    raise ConfigError("; ".join(problems))


def _requests(config, attributes, which: str, report: BadRecordReport
              ) -> list[steering.Request]:
  """The train or eval prompts (`runs.prompts`), every one asking for the run's attributes
  (the pairs train under that one label); skipped bad rows counted in `report`."""
  path = config.prompts.train_path if which == "train" else config.prompts.eval_path
  requests = prompts.read_requests(path, which, attributes, config, report)
  for r in requests:
    r.attributes = dict(attributes)
  return requests[:config.prompts.eval_limit or None] if which == "eval" else requests


def _answer(config, gen, scorer, weights, seed: int, sampling: SamplingConfig, n: int):
  def answer(start: int, batch: list[steering.Request]) -> list[dict]:
    results = best_of_n.best_of_n(gen, batch, n, scorer, weights,
                                  config.sampling.max_new_tokens, sampling, seed + start)
    return [req.output_row(res.response, best=res.best,
                           candidates=[vars(c) for c in res.candidates])
            for req, res in zip(batch, results)]
  return answer


def best_and_worst(rows: list[dict]) -> list[dict]:
  """A pair per row: its highest-reward answer against its lowest; rows whose answers
  tie (or could not be scored) give none."""
  pairs = []
  for row in rows:
    rewards = np.asarray([c["reward"] for c in row["candidates"]], np.float64)
    if not np.isfinite(rewards).all() or rewards.max() == rewards.min():
      continue
    hi, lo = int(np.argmax(rewards)), int(np.argmin(rewards))
    pairs.append({"prompt": row["prompt"], "chosen": row["candidates"][hi]["response"],
                  "rejected": row["candidates"][lo]["response"],
                  "chosen_reward": float(rewards[hi]), "rejected_reward": float(rewards[lo])})
  return pairs


def sample_round(config, setup, r: int, requests, scorer, weights) -> pathlib.Path:
  """Round r's samples (appended batch by batch, resumed) and its pairs file."""
  rdir = rounds.round_dir(setup.workdir, r)
  rdir.mkdir(parents=True, exist_ok=True)
  chosen = [requests[i] for i in rounds.prompt_indices(
      len(requests), config.prompts.per_iteration, config.seed, r)]
  sc = config.sampling
  model = loader.load_model(rounds.round_config(config, setup.workdir, r), setup.rt,
                             loader.DECODE)
  gen = rounds.generator(model, setup.rt, setup.tokenizer, config,
                         sc.max_batch or sc.batch_prompts * sc.responses)
  sampling = SamplingConfig(temperature=sc.temperature, top_p=sc.top_p, top_k=sc.top_k)
  append_batches(rdir / SAMPLES, chosen, steering.Request.matches, "--workdir",
                 sc.batch_prompts, _answer(config, gen, scorer, weights,
                                           rounds.sampling_seed(config.seed, r), sampling,
                                           sc.responses))
  path = rdir / PAIRS
  if processes.is_primary():
    rows = [json.loads(line) for line in (rdir / SAMPLES).read_text().splitlines()]
    pairs = best_and_worst(rows)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs))
    tmp.replace(path)
    logging.info("iterative_dpo round %d: %d pairs from %d prompts (%d ties dropped)", r,
                 len(pairs), len(rows), len(rows) - len(pairs))
  if rounds.line_count(path) == 0:
    raise ConfigError(f"{path}: every prompt's answers tied; raise sampling.responses or"
                      " sampling.temperature")
  return path


def train_round(config, setup, r: int, pairs: pathlib.Path, label: str) -> dict:
  """DPO on round r's pairs from round r-1's weights (the reference: those weights)."""
  sub = rounds.round_config(config, setup.workdir, r)
  sub.tokenizer = setup.tokenizer_dir
  sub.data.update(train_path=str(pairs), validation_path="", response_label=label)
  return preference.train(sub, str(rounds.round_dir(setup.workdir, r)))


def evaluate(config, setup, r: int, requests, scorer, weights) -> float:
  """The mean reward of the greedy answers of round r's result (0: the start)."""
  rdir = rounds.round_dir(setup.workdir, r)
  rdir.mkdir(parents=True, exist_ok=True)
  model = loader.load_model(rounds.round_config(config, setup.workdir, r + 1), setup.rt,
                             loader.DECODE)
  gen = rounds.generator(model, setup.rt, setup.tokenizer, config, len(requests))
  results = best_of_n.best_of_n(gen, requests, 1, scorer, weights,
                                config.sampling.max_new_tokens, SamplingConfig())
  rewards = [res.candidates[0].reward for res in results]
  mean = float(np.nanmean(rewards))
  attributes = {n: float(np.nanmean([res.candidates[0].scores[n] for res in results]))
                for n in HELPSTEER_ATTRIBUTES}
  if processes.is_primary():
    (rdir / EVAL).write_text(json.dumps({
        "reward": mean, "attributes": attributes,
        "answers": [{"prompt": q.prompt, "response": res.response,
                     "reward": res.candidates[0].reward, "scores": res.candidates[0].scores}
                    for q, res in zip(requests, results)]}, indent=1) + "\n")
  return mean


def _eval(rdir: pathlib.Path) -> dict | None:
  """Round r's greedy eval: its mean reward and mean prediction per attribute."""
  path = rdir / EVAL
  if not path.exists():
    return None
  data = json.loads(path.read_text())
  return {"reward": data["reward"], "attributes": data.get("attributes", {})}


def _table(evals: dict[int, dict | None]) -> str:
  names = next((list(e["attributes"]) for e in evals.values() if e), [])
  rows = ["| iteration | greedy reward | " + " | ".join(names) + " |",
          "|---|---|" + "---|" * len(names)]
  for r, e in evals.items():
    cells = (["-"] * (1 + len(names)) if e is None else
             [f"{e['reward']:.3f}"] + [f"{e['attributes'].get(n, float('nan')):.2f}"
                                       for n in names])
    rows.append(f"| {r} | " + " | ".join(cells) + " |")
  return "\n".join(rows)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  check(config)
  setup = setup_lib.prepare(config, workdir)
  loop.check_batch_config(config.train, setup.rt)
  spec = policy.source_spec(config)
  attributes = steering.run_attributes(config, spec)
  label = template.label_string(attributes) if attributes else ""
  bad = BadRecordReport()
  train, held_out = (rounds.fitting(_requests(config, attributes, which, bad), setup.tokenizer,
                                    config, config.sampling.max_new_tokens, f"{which} prompts")
                     for which in ("train", "eval"))
  scorer = load_scorer(config.scorer, setup.rt)
  # Prompts a generative judge has no room to judge would give no pair: left out.
  train, held_out = ([r for r, ok in zip(requests, sample_score.judged(scorer, requests,
                                                                        f"{which} prompt"))
                      if ok] for requests, which in ((train, "training"), (held_out, "eval")))
  weights = scoring_rewards.weight_vector(config.scorer.weights.to_dict())
  if not rounds.exists(rounds.round_dir(setup.workdir, 0) / EVAL):
    evaluate(config, setup, 0, held_out, scorer, weights)
  status = "finished"
  for r in range(1, config.iterations + 1):
    rdir = rounds.round_dir(setup.workdir, r)
    if rounds.finished(rdir) and rounds.exists(rdir / EVAL):
      continue
    if not rounds.finished(rdir):
      pairs = sample_round(config, setup, r, train, scorer, weights)
      result = train_round(config, setup, r, pairs, label)
      if result["status"] != "finished":
        status = result["status"]
        break
    evaluate(config, setup, r, held_out, scorer, weights)
  evals = {r: _eval(rounds.round_dir(setup.workdir, r)) for r in range(config.iterations + 1)}
  table = _table(evals)
  summary = {"status": status, "iterations": config.iterations,
             "eval_reward": {r: e and e["reward"] for r, e in evals.items()},
             "eval_attributes": {r: e and e["attributes"] for r, e in evals.items()},
             "table": table, "bad_records": bad.total}
  last = rounds.round_dir(setup.workdir, config.iterations)
  summary_lib.write_summary(
      setup.workdir / "summary.json", summary,
      f"iterative_dpo: {status}; greedy answers to {len(held_out)} held-out prompts per"
      f" iteration (0 = the starting policy): mean reward and mean prediction per"
      f" attribute:\n{table}", *summary_lib.skipped_lines(bad),
      outputs={"greedy answers, iteration 0": rounds.round_dir(setup.workdir, 0) / EVAL,
               f"greedy answers, iteration {config.iterations}": last / EVAL,
               "last round's pairs": last / PAIRS, "last round's HF model": last / "hf"})
  return summary
