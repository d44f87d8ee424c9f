"""A task's configured conversation source: `config.data.format` picks the reader.

"auto", "helpsteer" or "steerlm" read files, directories or hub ids through
`helpsteer.read_records` (see `rows.resolve_source`); "tfds" reads the
HelpSteer2 array_record dataset built by `tfds_helpsteer2` from
`data.train_path` (a TFDS data_dir), building it first from
`data.tfds_source_dir` (the hub's jsonl.gz files) when it is not there yet.
"""

from __future__ import annotations

import ml_collections

from helpsteer_jax.data.formats.helpsteer import read_records
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.records import Conversation


def load_conversations(source: str, split: str, config: ml_collections.ConfigDict,
                       report: BadRecordReport | None = None) -> list[Conversation]:
  """Reads `split` of `source`; bad rows stop the run or are skipped into `report`."""
  data = config.data
  if data.format == "tfds":
    from helpsteer_jax.data.formats import tfds_helpsteer2  # a heavy import: tfds
    if data.get("tfds_source_dir"):
      builder = tfds_helpsteer2.build_tfds_helpsteer2(data.tfds_source_dir, source,
                                                      on_bad_record=data.on_bad_record)
      if report is not None:
        report.merge(builder.bad_records)
    return tfds_helpsteer2.read_tfds_helpsteer2(source, split)
  return read_records(source, split=split, fmt=data.format,
                      on_bad_record=data.on_bad_record, report=report)
