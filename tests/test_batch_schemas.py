"""Every task's batch is its declared schema: featurizer output, pipeline batches, AOT inputs.

For each task the test runs the task's own featurizer on the demo data and
checks every example against `batch_schema(config)` (names, dtypes, shapes;
packed examples may be shorter than `train.seq_len`), then batches them as
`Trainer` does and checks the batch, and finally checks that the AOT step's
abstract batch has the same fields.
"""

import pathlib

import numpy as np
import pytest

from helpsteer_jax import runtime
from helpsteer_jax.data import pipeline
from helpsteer_jax.data.batches import (
  BT_BATCH,
  CACHED_PAIR_BATCH,
  PAIR_BATCH,
  REFERENCE_INPUT,
  SFT_BATCH,
  SchemaError,
)
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.models import hf
from helpsteer_jax.runs import preference
from helpsteer_jax.tasks import acsft, attribute_model, dpo2d
from helpsteer_jax.train import loop

from train_utils import task_config

TASKS = {"acsft": acsft, "attribute_model": attribute_model, "dpo2d": dpo2d}
CASES = {
    "acsft": ("acsft", {}),
    "acsft_padded": ("acsft", {"data.packing": False}),
    "regression": ("attribute_model", {}),
    "regular_bt": ("attribute_model", {"loss": "regular_bt", "data.packing": False}),
    "dpo2d_cached": ("dpo2d", {}),
    "dpo2d_on_the_fly": ("dpo2d", {"reference.mode": "on_the_fly"}),
}
ROWS = 4


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> pathlib.Path:
  return demo_tokenizer.build_demo_tokenizer(tmp_path_factory.mktemp("schemas") / "tokenizer")


def _config(task_name: str, overrides: dict, tokenizer_dir: pathlib.Path):
  config = task_config(task_name, overrides)
  config.tokenizer = str(tokenizer_dir)
  config.data.update(demo_train_rows=24, demo_validation_rows=4)
  if task_name == "dpo2d":
    config.data.update(demo_train_pairs=12, demo_validation_pairs=4)
  config.train.update(global_batch=8, micro_batch=8)
  return config


def _examples(task, config, workdir: pathlib.Path) -> list[dict]:
  """The task's own featurizer on its demo data."""
  tokenizer = hf.load_tokenizer(config.tokenizer)
  if task is dpo2d:
    train_src, _ = preference.data_sources(config, workdir)
    return preference.load_features(train_src, config,
                                    preference.loss_config(config, csv=False), tokenizer)
  return task.load_data(config, workdir, tokenizer)[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_featurizer_pipeline_and_aot_step_match_the_schema(case, tokenizer_dir, tmp_path):
  task_name, overrides = CASES[case]
  task = TASKS[task_name]
  config = _config(task_name, overrides, tokenizer_dir)
  schema, dims = task.batch_schema(config)
  examples = _examples(task, config, tmp_path)
  assert len(examples) >= ROWS

  fixed = config.data.get("fixed_shape", False)
  per_example = dims if fixed else {k: v for k, v in dims.items() if k != "length"}
  for example in examples:
    sizes = schema.check(example, batched=False, only="example", **per_example)
    assert sizes["length"] <= config.train.seq_len

  if schema is CACHED_PAIR_BATCH:  # what the reference pass adds
    examples = preference._with_reference(
        examples, np.zeros((len(examples), 2, dims["segments"]), np.float32))
  batch = next(iter(pipeline.training_dataset(examples, loop.pipeline_config(config, ROWS))))
  sizes = schema.check(batch, **dims)
  assert sizes[schema.batch_axis] == ROWS
  rows = {k: (v.shape[1:], v.dtype) for k, v in batch.items()}
  assert rows == schema.row_fields(**dims)

  spec = task.abstract_train_step(config, runtime.setup(config))
  step_batch = spec.args[1]
  accum = config.train.global_batch // config.train.micro_batch
  assert {k: (v.shape, v.dtype) for k, v in step_batch.items()} == {
      k: ((accum, config.train.micro_batch) + shape, dtype) for k, (shape, dtype) in rows.items()}


def test_schemas_derive_the_reference_input_and_the_cached_batch():
  assert REFERENCE_INPUT.names == ("inputs", "targets", "positions", "segment_ids",
                                   "token_segments", "seg_mask")
  assert CACHED_PAIR_BATCH.names == PAIR_BATCH.names + ("ref_logps",)
  assert CACHED_PAIR_BATCH.example_names == PAIR_BATCH.example_names
  assert SFT_BATCH.example_names == ("inputs", "targets", "weights")
  assert BT_BATCH.example_names == BT_BATCH.names  # a pair row brings its own segments


def test_a_batch_that_is_not_the_schema_is_refused():
  good = {k: np.zeros(shape, dtype)
          for k, (shape, dtype) in SFT_BATCH.row_fields(length=16).items()}
  batch = {k: v[None].repeat(2, 0) for k, v in good.items()}
  assert SFT_BATCH.view(batch).inputs.shape == (2, 16)
  with pytest.raises(SchemaError, match="lacks \\['weights'\\]"):
    SFT_BATCH.view({k: v for k, v in batch.items() if k != "weights"})
  with pytest.raises(SchemaError, match="length=8"):
    SFT_BATCH.view(dict(batch, targets=batch["targets"][:, :8]))
  with pytest.raises(SchemaError, match="dtype float64"):
    SFT_BATCH.check(dict(batch, weights=batch["weights"].astype(np.float64)))
  with pytest.raises(SchemaError, match="declared"):
    SFT_BATCH.example(inputs=good["inputs"], targets=good["targets"])
