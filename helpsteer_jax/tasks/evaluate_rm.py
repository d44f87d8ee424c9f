"""Reward-model evaluation: attribute metrics and pairwise accuracy.

The attribute model (any `config.scorer` source) on a labelled validation
file (HelpSteer / HelpSteer2 rows or labelled SteerLM conversations): MSE,
MAE, Pearson r and rounded accuracy per attribute, and a predicted-vs-true
figure. On HelpSteer2-Preference pairs and RewardBench files: pairwise
accuracy with reward = predicted attributes . `scorer.weights`, per subset
and per RewardBench section.
Writes `rm_report.json` and `rm_attributes.png` to the workdir and prints
the tables.

Several processes: each feeds only its devices' rows of every scoring batch
(sharded over the mesh); the predictions come back to every process, and
process 0 alone writes the report and the figure.
"""

from __future__ import annotations

import pathlib

import ml_collections
from absl import logging

from helpsteer_jax import multihost, processes
from helpsteer_jax.data.formats import helpsteer, preference
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.progress import Progress
from helpsteer_jax.scoring import evaluate as rm_eval
from helpsteer_jax.scoring import report as rm_report
from helpsteer_jax.scoring import rewards
from helpsteer_jax.scoring.load import load_scorer
from helpsteer_jax.tasks import setup as setup_lib
from helpsteer_jax.tasks import summary as summary_lib


def _warn(report: BadRecordReport, what: str) -> int:
  if report.total:
    logging.warning("%s: %s", what, report.summary())
  return report.total


def _sources(config, workdir: pathlib.Path) -> tuple[str, str, str]:
  data = config.data
  validation, pairs = data.validation_path, data.preference_path
  if not (validation or pairs or data.rewardbench_path):  # the demo rows and pairs
    validation = setup_lib.helpsteer_sources(config, workdir)[1]
    pairs = setup_lib.preference_sources(config, workdir)[1]
  return validation, pairs, data.rewardbench_path


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  weights = rewards.weight_vector(config.scorer.weights.to_dict())
  setup = setup_lib.prepare(config, workdir, tokenizer=False, model=False)
  workdir, data = setup.workdir, config.data
  validation, pairs_path, rewardbench_path = _sources(config, workdir)
  bad = BadRecordReport()
  sets = {}
  if validation:
    sets["attributes"] = helpsteer.read_records(validation, data.validation_split, data.format,
                                              data.on_bad_record, bad)
  if pairs_path:
    sets["helpsteer2_preference"] = preference.read_helpsteer2_preference(
        pairs_path, data.preference_split or None, data.on_bad_record, bad)
  if rewardbench_path:
    sets["rewardbench"] = preference.read_rewardbench(
        rewardbench_path, data.rewardbench_split, data.on_bad_record, bad)
  _warn(bad, "evaluation data")

  scorer = load_scorer(config.scorer, setup.rt)
  total = sum(len(v) if k == "attributes" else 2 * sum(p.strength != 0 for p in v)
              for k, v in sets.items())
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
    for name in ("helpsteer2_preference", "rewardbench"):
      if name in sets:
        report[name] = rm_eval.evaluate_pairs(scorer, sets[name], weights, progress.update)
        tables.append(rm_report.pairs_table(name, report[name]))
  finally:
    progress.close()
  multihost.report_split("evaluate_rm: sequences scored", scorer.local_rows)
  summary_lib.write_summary(workdir / "rm_report.json", report, "\n\n".join(tables),
                       f"evaluate_rm: report in {workdir / 'rm_report.json'}")
  return report
