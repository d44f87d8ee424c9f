"""Reward-model evaluation: attribute metrics and pairwise accuracy.

The attribute model (any `config.scorer` source) on a labelled validation
file (HelpSteer / HelpSteer2 rows or labelled SteerLM conversations): MSE,
MAE, Pearson r and rounded accuracy per attribute, and a predicted-vs-true
figure. On HelpSteer2-Preference pairs, HelpSteer3's preference config
(`data.helpsteer3_path`; its subsets are the domains) and RewardBench files: pairwise
accuracy with reward = predicted attributes . `scorer.weights`, per subset
and per RewardBench section. The reward-model benchmarks (`data.rm_bench_path`,
`data.judgebench_path`, `data.rewardbench2_path`): RM-Bench's hard / normal / easy
accuracy per domain, JudgeBench's double-judged accuracy per category and RewardBench
2's best-of-n and Ties scores per subset (`scoring.benchmarks`), with the same reward.
Writes `rm_report.json` and `rm_attributes.png` to the workdir and prints
the tables.

`variants` ("name=source,name=source@attribute,...") compares several reward
models in one table instead: each source (any scorer source) on the pairs
alone, its reward the predictions . `scorer.weights`, or with `@attribute`
that attribute's slot alone (a Bradley-Terry model's `bt_attribute`). With no
data configured the demo's validation rows, its HelpSteer2-Preference pairs
and the same pairs as a RewardBench-format file (`demo.rows.rewardbench_subset`)
are evaluated.

Several processes: each feeds only its devices' rows of every scoring batch
(sharded over the mesh); the predictions come back to every process, and
process 0 alone writes the report and the figure.
"""

from __future__ import annotations

import dataclasses
import pathlib

import ml_collections
import numpy as np
from absl import logging

from helpsteer_jax import multihost, processes
from helpsteer_jax.data.formats import benchmarks, helpsteer, helpsteer3, preference
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError, EvaluationError
from helpsteer_jax.progress import Progress
from helpsteer_jax.runs import demo_sources
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib
from helpsteer_jax.scoring import evaluate as rm_eval
from helpsteer_jax.scoring import judge_budget, rewards
from helpsteer_jax.scoring import report as rm_report
from helpsteer_jax.scoring.benchmarks import BENCHMARKS
from helpsteer_jax.scoring.load import check_source, load_scorer, scorer_reads, unscored_cause


def _warn(report: BadRecordReport, what: str) -> int:
  if report.total:
    logging.warning("%s: %s", what, report.summary())
  return report.total


@dataclasses.dataclass(frozen=True)
class Variant:
  """One reward model of `variants`: its name, scorer source and reward (an attribute
  read alone, or "" for `scorer.weights`)."""
  name: str
  source: str
  attribute: str = ""

  def weights(self, default: np.ndarray) -> np.ndarray:
    if not self.attribute:
      return default
    return np.asarray([a == self.attribute for a in ATTRIBUTES], np.float32)


def config_reads() -> list:
  """The scorer kind's keys (`variants` load several scorers from the section: all read)."""
  return scorer_reads(reads_all=lambda c: bool(c.variants))


def parse_variants(spec: str) -> list[Variant]:
  """`name=source[@attribute],...` as Variants, each checked (ConfigError naming it)."""
  variants = []
  for item in (part.strip() for part in spec.split(",") if part.strip()):
    name, sep, rest = item.partition("=")
    source, _, attribute = rest.rpartition("@") if "@" in rest else (rest, "", "")
    name, source, attribute = name.strip(), source.strip(), attribute.strip()
    if not (sep and name and source):
      raise ConfigError(f"variants: {item!r} is not name=source[@attribute] (e.g."
                        " regression=workdir/attribute_model,"
                        "scaled_bt=workdir/attribute_model_bt@helpfulness)")
    if attribute and attribute not in ATTRIBUTES:
      raise ConfigError(f"variants: {item!r} reads attribute {attribute!r}; choose one of"
                        f" {', '.join(ATTRIBUTES)}")
    if any(v.name == name for v in variants):
      raise ConfigError(f"variants: the name {name!r} is given twice")
    variants.append(Variant(name, check_source(source, f"variants[{name}]"), attribute))
  return variants


# The pair sets, in the report's order (each scored by evaluate_pairs), then the
# benchmarks (each scored by its BENCHMARKS entry).
PAIR_SETS = ("helpsteer2_preference", "helpsteer3_preference", "rewardbench")
SCORED_SETS = (*PAIR_SETS, *BENCHMARKS)


def _size(name: str, rows) -> int:
  """The conversations scoring a set takes (the progress bar's count)."""
  if name in BENCHMARKS:
    return BENCHMARKS[name].size(rows)
  return len(rows) if name == "attributes" else 2 * sum(p.strength != 0 for p in rows)


def _evaluate(name: str, scorer, rows, weights: np.ndarray, on_batch) -> dict:
  if name in BENCHMARKS:
    return BENCHMARKS[name].evaluate(scorer, rows, weights, on_batch)
  return rm_eval.evaluate_pairs(scorer, rows, weights, on_batch)


def check_fits(scorer, sets: dict) -> None:
  """Before anything compiles: a generative judge's budget fits some of the sets' judge
  prompts (`judge_budget.fitting`: ConfigError when none, a warning with the count of
  those that cannot be judged)."""
  groups = [g for name in SCORED_SETS if name in sets for g in (
      BENCHMARKS[name].groups(sets[name]) if name in BENCHMARKS
      else [(p.chosen, p.rejected) for p in sets[name] if p.strength != 0])]
  judge_budget.fitting(scorer, groups, "evaluation row")


def unjudged(results: dict, sets: dict, section, scorer) -> str:
  """"" when every set with something to judge judged some of it; else which judged
  nothing, why (`load.unscored_cause`) and what to change."""
  empty = [name for name in SCORED_SETS if name in results and _size(name, sets[name])
           and not rm_report.judged(name, results[name])]
  if sets.get("attributes") and results.get("attributes_dropped") == len(sets["attributes"]):
    empty.insert(0, "attributes")
  if not empty:
    return ""
  return (f"nothing of {', '.join(empty)} was scored (every response unscored, NaN):"
          f" {unscored_cause(section, scorer)}")


def _sources(config, workdir: pathlib.Path) -> tuple[str, str, str]:
  data = config.data
  validation, pairs = data.validation_path, data.preference_path
  rewardbench = data.rewardbench_path
  if not (validation or pairs or rewardbench or data.helpsteer3_path or data.rm_bench_path
          or data.judgebench_path or data.rewardbench2_path):  # the demo's
    validation = demo_sources.helpsteer_sources(config, workdir)[1]
    pairs = demo_sources.preference_sources(config, workdir)[1]
    rewardbench = demo_sources.rewardbench_source(config, workdir)
  return validation, pairs, rewardbench


def evaluate_variants(config, rt, variants: list[Variant], sets: dict,
                      weights: np.ndarray) -> tuple[dict, dict[str, str]]:
  """({variant: {source, reward, <set>: its pair or benchmark result}}, {variant: what it
  judged nothing of, `unjudged`}), one model loaded at a time."""
  names = [n for n in SCORED_SETS if n in sets]
  total = len(variants) * sum(_size(n, sets[n]) for n in names)
  progress = Progress(total=total, initial=0, desc="evaluate_rm variants")
  out, problems = {}, {}
  try:
    for variant in variants:
      section = config.scorer.copy_and_resolve_references()
      section.source = variant.source
      scorer = load_scorer(section, rt, key=f"variants[{variant.name}]")
      check_fits(scorer, sets)
      w = variant.weights(weights)
      out[variant.name] = {"source": variant.source,
                           "reward": variant.attribute or "scorer.weights",
                           "reward_weights": w.tolist()}
      for name in names:
        out[variant.name][name] = _evaluate(name, scorer, sets[name], w, progress.update)
      problems[variant.name] = unjudged(out[variant.name], sets, section, scorer)
      del scorer
  finally:
    progress.close()
  return out, problems


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  weights = rewards.weight_vector(config.scorer.weights.to_dict())
  variants = parse_variants(config.variants)
  setup = setup_lib.prepare(config, workdir, tokenizer=False, model=False)
  workdir, data = setup.workdir, config.data
  validation, pairs_path, rewardbench_path = _sources(config, workdir)
  bad = BadRecordReport()
  sets = {}
  if config.scorer.get("judge") and validation:  # one reward: no attribute to compare
    if data.validation_path:
      raise ConfigError(f"scorer.judge={config.scorer.judge} gives one reward per response,"
                        " not the attributes data.validation_path's metrics compare: leave it"
                        " empty and give preference pairs or benchmarks")
    validation = ""
  if validation and not variants:
    sets["attributes"] = helpsteer.read_records(validation, data.validation_split, data.format,
                                              data.on_bad_record, bad)
  if pairs_path:
    sets["helpsteer2_preference"] = preference.read_helpsteer2_preference(
        pairs_path, data.preference_split or None, data.on_bad_record, bad)
  if data.helpsteer3_path:  # per-domain accuracy in by_subset
    sets["helpsteer3_preference"] = helpsteer3.read_preference_pairs(
        data.helpsteer3_path, data.helpsteer3_split, on_bad_record=data.on_bad_record,
        report=bad, domains=helpsteer3.filter_list(data.domains),
        languages=helpsteer3.filter_list(data.languages))
  if rewardbench_path:
    sets["rewardbench"] = preference.read_rewardbench(
        rewardbench_path, data.rewardbench_split, data.on_bad_record, bad)
  if data.rm_bench_path:
    sets["rm_bench"] = benchmarks.read_rm_bench(data.rm_bench_path, data.on_bad_record, bad)
  if data.judgebench_path:
    sets["judgebench"] = benchmarks.read_judgebench(data.judgebench_path, data.on_bad_record,
                                                    bad)
  if data.rewardbench2_path:
    sets["rewardbench2"] = benchmarks.read_rewardbench2(
        data.rewardbench2_path, data.rewardbench2_split, data.on_bad_record, bad)
  _warn(bad, "evaluation data")
  if variants:
    results, problems = evaluate_variants(config, setup.rt, variants, sets, weights)
    report = {"variants": results, "bad_records": bad.total}
    summary_lib.write_summary(workdir / "rm_report.json", report,
                              rm_report.variants_table(report["variants"]))
    if any(problems.values()):
      raise EvaluationError("evaluate_rm: " + "; ".join(
          f"variant {name}: {problem}" for name, problem in problems.items() if problem))
    return report

  scorer = load_scorer(config.scorer, setup.rt)
  check_fits(scorer, sets)
  total = sum(_size(k, v) for k, v in sets.items())
  progress = Progress(total=total, initial=0, desc="evaluate_rm")
  report = {"reward_weights": weights.tolist(), "bad_records": bad.total}
  tables = []
  try:
    if "attributes" in sets:
      result = rm_eval.evaluate_attributes(scorer, sets["attributes"], progress.update)
      report["attributes"] = result["metrics"]
      report["attributes_dropped"] = result["dropped"]
      tables.append(rm_report.attribute_table(result["metrics"]))
      if processes.is_primary():
        rm_report.plot_attributes(result["predictions"], result["labels"],
                                  workdir / "rm_attributes.png", result["metrics"])
    for name in SCORED_SETS:
      if name in sets:
        report[name] = _evaluate(name, scorer, sets[name], weights, progress.update)
        tables.append(rm_report.set_table(name, report[name]))
  finally:
    progress.close()
  multihost.report_split("evaluate_rm: sequences scored", scorer.local_rows)
  summary_lib.write_summary(workdir / "rm_report.json", report, "\n\n".join(tables),
                            outputs={"plot": workdir / "rm_attributes.png"})
  problem = unjudged(report, sets, config.scorer, scorer)
  if problem:
    raise EvaluationError(f"evaluate_rm: {problem}")
  return report
