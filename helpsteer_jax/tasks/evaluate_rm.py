"""Reward-model evaluation: attribute metrics and pairwise accuracy.

On a labelled validation file (HelpSteer / HelpSteer2 rows or labelled
SteerLM conversations): MSE, MAE, Pearson r and rounded accuracy per
attribute, and a predicted-vs-true figure. On HelpSteer2-Preference pairs
and RewardBench files: pairwise accuracy with reward = predicted
attributes . `reward_weights`, per subset and per RewardBench section.
Writes `rm_report.json` and `rm_attributes.png` to the workdir and prints
the tables.

Several processes: each feeds only its devices' rows of every scoring batch
(sharded over the mesh); the predictions come back to every process, and
process 0 alone writes the report and the figure.
"""

from __future__ import annotations

import pathlib

import jax
import ml_collections
from absl import logging

from helpsteer_jax import multihost, reward_runtime
from helpsteer_jax.data.formats import helpsteer, preference
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.eval import rm_eval, rm_report
from helpsteer_jax.tasks import common
from helpsteer_jax.train import metrics as metrics_lib


def _warn(report: BadRecordReport, what: str) -> int:
  if report.total:
    logging.warning("%s: %s", what, report.summary())
  return report.total


def _sources(config, workdir: pathlib.Path) -> tuple[str, str, str]:
  data = config.data
  validation, pairs = data.validation_path, data.preference_path
  if not (validation or pairs or data.rewardbench_path):  # the demo rows and pairs
    validation = common.helpsteer_sources(config, workdir)[1]
    pairs = common.preference_sources(config, workdir)[1]
  return validation, pairs, data.rewardbench_path


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  reward_runtime.require_trained(config, "evaluation")
  weights = tuple(float(w) for w in config.reward_weights)
  if len(weights) != len(ATTRIBUTES):
    raise ConfigError(f"reward_weights has {len(weights)} values; give one per attribute"
                      f" ({', '.join(ATTRIBUTES)})")
  setup = common.prepare(config, workdir, model=False)
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

  scorer, tok = reward_runtime.build_scorer(config, setup.rt, setup.tokenizer)
  total = sum(len(v) if k == "attributes" else 2 * sum(p.strength != 0 for p in v)
              for k, v in sets.items())
  progress = metrics_lib.Progress(total=total, initial=0, desc="evaluate_rm")
  report = {"reward_weights": list(weights), "bad_records": bad.total}
  tables = []
  try:
    if "attributes" in sets:
      result = rm_eval.evaluate_attributes(scorer, tok, sets["attributes"], progress.update)
      report["attributes"] = result["metrics"]
      report["attributes_dropped"] = result["dropped"]
      tables.append(rm_report.attribute_table(result["metrics"]))
      if jax.process_index() == 0:
        rm_report.plot_attributes(result["predictions"], result["labels"],
                                  workdir / "rm_attributes.png", result["metrics"])
    for name in ("helpsteer2_preference", "rewardbench"):
      if name in sets:
        report[name] = rm_eval.evaluate_pairs(scorer, tok, sets[name], weights, progress.update)
        tables.append(rm_report.pairs_table(name, report[name]))
  finally:
    progress.close()
  multihost.report_split("evaluate_rm: sequences scored", scorer.local_rows)
  common.write_summary(workdir / "rm_report.json", report, "\n\n".join(tables),
                       f"evaluate_rm: report in {workdir / 'rm_report.json'}")
  return report
