"""Build HelpSteer-2D JSONL from preference pairs with a trained attribute model.

HelpSteer2 -> attribute model -> this task -> 2D-DPO (configs/dpo2d.py with
data.train_path set to the output and loss.aspects set to the five HelpSteer
attributes).

The scorer is the project's attribute model (`scorer.factory=attribute_model`,
the default: `init.checkpoint` / `model.hf_path`, scored on the mesh as in
annotation) or a user's `package.module:function` (host-side Python).

Several processes: every process reads and segments all pairs. The built-in
model is run by all processes together: each scoring batch is sharded over
the mesh, so each process's devices score their rows. A user's scorer is
called on each process with only its contiguous share of the texts, and the
predictions are gathered. Process 0 alone writes the output.
"""

from __future__ import annotations

import pathlib
from typing import Sequence

import jax
import ml_collections
import numpy as np
from absl import logging

from helpsteer_jax import reward_runtime, runtime
from helpsteer_jax.data.features import rm as rm_data
from helpsteer_jax.data.formats import helpsteer_2d
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.records import ATTRIBUTES, HELPSTEER_ATTRIBUTES, Conversation
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.eval import rm_eval
from helpsteer_jax.inference import segment_scores
from helpsteer_jax.inference.attribute_scorer import load_scorer
from helpsteer_jax.inference.scoring import RewardModelScorer
from helpsteer_jax.tasks import common

BUILTIN = "attribute_model"


class AttributeModelScorer:
  """The attribute model on the mesh as an `attribute_scorer.MeshScorer`.

  A conversation that does not fit `score.max_len` (its context cut from the
  left) gets NaN predictions.
  """

  def __init__(self, scorer: RewardModelScorer, tok: rm_data.RegressionTokenizer):
    self.scorer, self.tok = scorer, tok

  @property
  def local_rows(self) -> int:
    return self.scorer.local_rows

  def score_conversations(self, convs: Sequence[Conversation]) -> np.ndarray:
    preds, kept = rm_eval.score_conversations(self.scorer, self.tok, convs)
    out = np.full((len(convs), len(ATTRIBUTES)), np.nan, np.float32)
    out[kept] = preds
    return out


def _scorer(config: ml_collections.ConfigDict, workdir: pathlib.Path):
  factory = config.scorer.factory
  if factory != BUILTIN:
    return load_scorer(factory, config.scorer, key="scorer.factory")
  reward_runtime.require_trained(config, "build_2d")
  setup = common.prepare(config, workdir, model=False)
  return AttributeModelScorer(*reward_runtime.build_scorer(config, setup.rt, setup.tokenizer))


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  workdir = pathlib.Path(workdir)
  if config.segment_score not in segment_scores.MODES:
    raise ConfigError(f"segment_score={config.segment_score!r}; choose one of"
                      f" {segment_scores.MODES}")
  if not config.scorer.factory:
    raise ConfigError(f"build_2d scores segments with a trained attribute model: set"
                      f" --config.scorer.factory={BUILTIN} (the project's attribute model,"
                      " from --config.init.checkpoint=<attribute_model run>) or"
                      " package.module:function (a function taking config.scorer and"
                      " returning texts -> [n, 9] predictions)")
  runtime.check_workdir(workdir)
  source = config.data.input_path or common.demo_2d_files(workdir, config.data.demo_rows, 0)[0]
  report = BadRecordReport()
  plain = helpsteer_2d.read_plain_pairs(source, config.data.split, config.data.on_bad_record,
                                        report)
  if config.data.max_pairs:
    plain = plain[:config.data.max_pairs]
  if not plain:
    raise ConfigError(f"no preference pairs in {source}")
  scorer = _scorer(config, workdir)
  logging.info("scoring the segments of %d pairs (%s)", len(plain), config.segment_score)
  built = segment_scores.score_pairs(plain, scorer, config.segment_score,
                                     config.data.score_max, config.scorer.batch)
  out = pathlib.Path(config.data.output_path or workdir / "helpsteer_2d.jsonl")
  summary = {"pairs": len(built), "output": str(out), "mode": config.segment_score,
             "segments": sum(len(p.chosen.segments) + len(p.rejected.segments) for p in built),
             "unscored_pairs": len(plain) - len(built), "skipped_rows": report.total}
  if jax.process_index() == 0:
    out.parent.mkdir(parents=True, exist_ok=True)
    helpsteer_2d.write_2d(out, built, HELPSTEER_ATTRIBUTES)
  common.write_summary(workdir / "build_2d.json", summary,
                       f"build_2d: wrote {len(built)} pairs to {out}")
  return summary
