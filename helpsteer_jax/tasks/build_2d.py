"""Build HelpSteer-2D JSONL from preference pairs with a trained attribute model.

HelpSteer2 -> attribute model -> this task -> 2D-DPO (configs/dpo2d.py with
data.train_path set to the output and loss.aspects set to the five HelpSteer
attributes).

The scorer is `config.scorer`'s (`scoring.load.load_scorer`): the project's
attribute model (an attribute_model run or its HF export, scored on the mesh
as in annotation), a server's, or a user's `package.module:function`.

Several processes: every process reads and segments all pairs and calls the
scorer with the same conversations (the scorer shares the work out: batches
sharded over the mesh, or a host-side scorer's contiguous shares gathered).
Process 0 alone writes the output.
"""

from __future__ import annotations

import pathlib

import ml_collections
from absl import logging

from helpsteer_jax import processes
from helpsteer_jax.data.formats import helpsteer_2d
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.records import HELPSTEER_ATTRIBUTES
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import setup_2d
from helpsteer_jax.runs import summary as summary_lib
from helpsteer_jax.scoring import segments
from helpsteer_jax.scoring.load import load_scorer, scorer_reads


def config_reads() -> list:
  """The scorer kind's keys."""
  return scorer_reads()


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  workdir = pathlib.Path(workdir)
  if config.segment_score not in segments.MODES:
    raise ConfigError(f"segment_score={config.segment_score!r}; choose one of"
                      f" {segments.MODES}")
  setup = setup_lib.prepare(config, workdir, tokenizer=False, model=False)
  source = config.data.input_path or setup_2d.demo_2d_files(workdir, config.data.demo_rows, 0)[0]
  report = BadRecordReport()
  plain = helpsteer_2d.read_plain_pairs(source, config.data.split, config.data.on_bad_record,
                                        report)
  if config.data.max_pairs:
    plain = plain[:config.data.max_pairs]
  if not plain:
    raise ConfigError(f"no preference pairs in {source}")
  scorer = load_scorer(config.scorer, setup.rt)
  logging.info("scoring the segments of %d pairs (%s)", len(plain), config.segment_score)
  built = segments.score_pairs(plain, scorer, config.segment_score, config.data.score_max)
  out = pathlib.Path(config.data.output_path or workdir / "helpsteer_2d.jsonl")
  summary = {"pairs": len(built), "output": str(out), "mode": config.segment_score,
             "segments": sum(len(p.chosen.segments) + len(p.rejected.segments) for p in built),
             "unscored_pairs": len(plain) - len(built), "skipped_rows": report.total}
  if processes.is_primary():
    out.parent.mkdir(parents=True, exist_ok=True)
    helpsteer_2d.write_2d(out, built, HELPSTEER_ATTRIBUTES)
  summary_lib.write_summary(workdir / "build_2d.json", summary,
                       f"build_2d: {len(built)} pairs", outputs={"HelpSteer-2D pairs": out})
  return summary
