"""HelpSteer2 as a TFDS dataset in array_record files, built and read without TensorFlow.

The builder reads the local `train.jsonl.gz` / `validation.jsonl.gz` (from
`source_dir`, else TFDS's manual_dir; it never downloads, and GCS lookups
are off) and writes array_record shards in the hub's row order. With
tensorflow-datasets 4.9 both building (features are serialized with TFDS's
own protobuf code) and reading through `tfds.data_source` work without
TensorFlow installed; only tf.data (`as_dataset`) needs it, and we do not
use it. Importing this module registers the builder under the name
"helpsteer2".
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from helpsteer_jax.data.formats import helpsteer, rows
from helpsteer_jax.data.records import HELPSTEER_ATTRIBUTES, Conversation
from helpsteer_jax.errors import ConfigError

NAME = "helpsteer2"
SPLITS = ("train", "validation")


class HelpSteer2(tfds.core.GeneratorBasedBuilder):
  """nvidia/HelpSteer2 (prompt, response, five 0..4 scores) from local files."""

  name = NAME
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "train and validation from the hub's jsonl.gz files."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Download train.jsonl.gz and validation.jsonl.gz of nvidia/HelpSteer2 into the"
      " manual directory, or pass source_dir= to the builder.")

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    # TFDS 4.9's own lookup imports `importlib_resources`, which it declares
    # only for Python < 3.9 and which recent etils no longer pulls in.
    return epath.Path(__file__)

  def __init__(self, *, source_dir: str | os.PathLike | None = None,
               on_bad_record: str = "error", **kwargs):
    rows.check_on_bad_record(on_bad_record)
    self._source_dir = source_dir
    self._on_bad_record = on_bad_record
    self.bad_records = rows.BadRecordReport()
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    features = {"prompt": tfds.features.Text(), "response": tfds.features.Text()}
    features.update({name: tfds.features.Scalar(np.int32) for name in HELPSTEER_ATTRIBUTES})
    return tfds.core.DatasetInfo(
        builder=self,
        description="HelpSteer2: prompts, responses and five 0-4 attribute scores.",
        features=tfds.features.FeaturesDict(features),
        homepage="https://huggingface.co/datasets/nvidia/HelpSteer2",
        license="CC-BY-4.0",
        disable_shuffling=True)  # keep the hub's row order, as read_helpsteer gives it

  def _split_generators(self, dl_manager):
    if self._source_dir is not None:
      source = pathlib.Path(self._source_dir)
    else:
      try:
        source = pathlib.Path(dl_manager.manual_dir)
      except AssertionError as e:  # TFDS's "manual directory does not exist" + instructions
        raise ConfigError(str(e)) from e
    return {split: self._generate_examples(*rows.resolve_source(source, split), split)
            for split in SPLITS}

  def _generate_examples(self, kind: str, location: str, split: str):
    checked = rows.iter_checked_rows(
        rows.iter_rows(kind, location, split), location,
        lambda row, where: helpsteer.helpsteer_fields(row),
        self._on_bad_record, self.bad_records, by_row=rows.row_numbered(kind))
    for line, (prompt, response, scores) in checked:
      yield line, {"prompt": prompt, "response": response, **scores}


def build_tfds_helpsteer2(source_dir: str | os.PathLike, data_dir: str | os.PathLike,
                          on_bad_record: str = "error") -> HelpSteer2:
  """Writes the array_record dataset under `data_dir` (a no-op when it exists)."""
  builder = HelpSteer2(source_dir=source_dir, on_bad_record=on_bad_record,
                       data_dir=os.fspath(data_dir), file_format="array_record")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return builder


def read_tfds_helpsteer2(data_dir: str | os.PathLike, split: str) -> list[Conversation]:
  """The built split as conversations, read through `tfds.data_source` (no TensorFlow)."""
  where = os.path.join(os.fspath(data_dir), NAME, str(HelpSteer2.VERSION))
  if not os.path.isfile(os.path.join(where, "dataset_info.json")):
    raise ConfigError(f"no built {NAME} dataset in {where}; build it with"
                      " build_tfds_helpsteer2(source_dir, data_dir)")
  try:
    source = tfds.data_source(NAME, split=split, data_dir=os.fspath(data_dir), download=False)
  except (AssertionError, KeyError, ValueError, NotImplementedError) as e:
    raise ConfigError(f"cannot read split {split!r} of {where}: {e}") from e
  out = []
  for i in range(len(source)):
    ex = source[i]
    scores = {name: int(ex[name]) for name in HELPSTEER_ATTRIBUTES}
    out.append(helpsteer.helpsteer_conversation(
        ex["prompt"].decode("utf-8"), ex["response"].decode("utf-8"), scores,
        source=f"{where}[{split}]:{i + 1}"))
  return out
