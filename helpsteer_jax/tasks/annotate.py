"""Annotation (SteerLM step 2): label conversations with the attribute model.

The scorer is `config.scorer`'s (`scoring.load.load_scorer`): the project's
attribute model (an attribute_model run or its HF export, on the mesh), a
server's (`scorer.source=http://host:port/v1`) or a user's function.

Reads SteerLM conversations or HelpSteer-style rows, predicts the nine
attributes of every assistant turn (the conversation up to that turn in the
regression format), clips to 0..4, rounds, and writes each turn's label
string into a SteerLM jsonl file. Work goes in chunks of `chunk_rows`
conversations, scored batched by length over the mesh and appended in input
order with an fsync; a rerun keeps the complete rows already written (a torn
last line is cut off), rescores the chunk it stopped in (so every chunk is
batched as in an uninterrupted run) and appends the rest, so no row is
duplicated or lost.

Several processes: every process reads the input and calls the scorer with the
same conversations; each feeds only its devices' rows of every scoring batch
(the batch is sharded over the mesh; a host-side scorer gets each process's
share of it), and process 0 alone decides where to resume and writes the output.
"""

from __future__ import annotations

import pathlib
from typing import Sequence

import ml_collections
import numpy as np

from helpsteer_jax import multihost, resume
from helpsteer_jax.data.formats import helpsteer
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.data.template import label_string
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.progress import Progress
from helpsteer_jax.runs import demo_sources
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.runs import summary as summary_lib
from helpsteer_jax.scoring.load import load_scorer, scorer_reads
from helpsteer_jax.scoring.metrics import rounded
from helpsteer_jax.scoring.scorer import Scorer, predict


def config_reads() -> list:
  """The scorer kind's keys."""
  return scorer_reads()


def _same_text(row: dict, conv: Conversation) -> bool:
  turns = row.get("conversations") or []
  return len(turns) == len(conv.turns) and all(
      t.get("value") == c.text for t, c in zip(turns, conv.turns))


def _targets(convs: Sequence[Conversation]) -> list[tuple[int, int, Conversation]]:
  """(conversation, turn, prefix ending at that assistant turn) for every response."""
  out = []
  for c, conv in enumerate(convs):
    for t, turn in enumerate(conv.turns):
      if turn.role != conv.mask_role and t > 0:
        out.append((c, t, Conversation(conv.system, conv.turns[:t + 1], conv.mask_role,
                                       source=conv.source)))
  return out


def _labelled(conv: Conversation, labels: dict[int, str]) -> Conversation:
  turns = tuple(Turn(t.role, t.text, labels.get(i, t.label if t.role != conv.mask_role else None))
                for i, t in enumerate(conv.turns))
  return Conversation(conv.system, turns, conv.mask_role, source=conv.source)


def attribute_selection(spec: str) -> list[int]:
  names = [s.strip() for s in spec.split(",") if s.strip()] if spec else list(ATTRIBUTES)
  unknown = [n for n in names if n not in ATTRIBUTES]
  if unknown:
    raise ConfigError(f"attributes: unknown {unknown}; choose from {', '.join(ATTRIBUTES)}")
  return [ATTRIBUTES.index(n) for n in names]


def annotate(convs: Sequence[Conversation], scorer: Scorer, out_path: pathlib.Path,
             chunk_rows: int, slots: Sequence[int]) -> dict:
  """Labels and appends the rows not yet in `out_path`; returns counts.

  Each chunk's turns are scored together (a rerun scores the chunk it
  stopped in whole, so its batches are those of an uninterrupted run).
  """
  start = resume.resume_point(out_path, convs, _same_text, "data.output_path")
  first = resume.batch_start(start, chunk_rows, len(convs))
  todo = _targets(convs[first:])
  counts = {"rows": len(convs), "already_written": start, "written": 0, "turns": len(todo),
            "unscored_turns": 0}
  progress = Progress(total=len(todo), initial=0, desc="annotate")
  try:
    with resume.RowWriter(out_path) as writer:
      for lo in range(first, len(convs), chunk_rows):
        chunk = convs[lo:lo + chunk_rows]
        targets = _targets(chunk)
        preds = predict([p for _, _, p in targets], scorer, progress.update)
        scored = ~np.isnan(preds).any(axis=1)
        counts["unscored_turns"] += int((~scored).sum())
        preds = rounded(np.where(scored[:, None], preds, 0.0))
        labels: list[dict[int, str]] = [{} for _ in chunk]
        for i in np.flatnonzero(scored):
          c, t, _ = targets[i]
          labels[c][t] = label_string({ATTRIBUTES[j]: int(preds[i, j]) for j in slots})
        # The chunk the last run stopped in is scored whole, as it was then.
        new = [(conv, lab) for r, (conv, lab) in enumerate(zip(chunk, labels), lo) if r >= start]
        writer.write(helpsteer.steerlm_row(_labelled(conv, lab)) for conv, lab in new)
        counts["written"] += len(new)
  finally:
    progress.close()
  return counts


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  slots = attribute_selection(config.attributes)
  setup = setup_lib.prepare(config, workdir, tokenizer=False, model=False)
  workdir = setup.workdir
  scorer = load_scorer(config.scorer, setup.rt)
  source = config.data.input_path or demo_sources.helpsteer_sources(config, workdir)[0]
  report = BadRecordReport()
  convs = helpsteer.read_records(source, split=config.data.input_split, fmt=config.data.format,
                                 on_bad_record=config.data.on_bad_record, report=report)
  if config.data.max_rows:
    convs = convs[:config.data.max_rows]
  out_path = pathlib.Path(config.data.output_path or workdir / "annotated.jsonl")
  out_path.parent.mkdir(parents=True, exist_ok=True)
  counts = annotate(convs, scorer, out_path, config.data.chunk_rows, slots)
  counts["bad_records"] = report.total
  multihost.report_split("annotate: sequences scored", scorer.local_rows)
  summary_lib.write_summary(
      workdir / "annotate_summary.json", counts,
      f"annotate: {counts['written']} rows written to {out_path}"
      f" ({counts['already_written']} already there, {counts['turns']} turns scored,"
      f" {counts['unscored_turns']} too long to score, {report.total} bad records"
      f"{': ' + report.summary() if report.total else ''})",
      outputs={"SteerLM jsonl": out_path})
  return counts
