"""Attribute-model, evaluation and annotation presets: recipe numbers and early failures."""

import runpy

import pytest

from helpsteer_jax import runtime
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.tasks import attribute_model

from conftest import REPO_ROOT


def get(task, preset=""):
  module = runpy.run_path(str(REPO_ROOT / "configs" / f"{task}.py"))
  return module["get_config"](preset) if preset else module["get_config"]()


def test_attribute_model_recipes():
  c = get("attribute_model", "llama3_70b_helpsteer2")
  assert (c.model.name, c.train.num_steps, c.train.global_batch, c.train.seq_len) == (
      "llama3_70b", 317, 128, 4096)
  assert (c.optimizer.lr, c.optimizer.schedule, c.optimizer.warmup_steps) == (2e-6, "constant", 10)
  assert c.loss == "regression" and c.data.packing
  c = get("attribute_model", "llama2_13b_helpsteer")
  assert (c.model.name, c.train.num_steps, c.train.global_batch) == ("llama2_13b", 800, 512)
  assert (c.optimizer.lr, c.optimizer.min_lr, c.optimizer.schedule) == (9e-6, 9e-7, "cosine")
  c = get("attribute_model", "llama3_1_70b_scaled_bt")
  assert (c.model.name, c.loss, c.train.num_steps, c.train.global_batch) == (
      "llama3_1_70b", "scaled_bt", 105, 128)
  assert (c.optimizer.lr, c.optimizer.warmup_steps, c.data.packing) == (1e-6, 10, False)
  assert c.init.head == "auto"
  with pytest.raises(ValueError, match="llama3_70b_helpsteer2"):
    get("attribute_model", "nope")


def test_recipes_fail_before_any_work_without_their_inputs():
  with pytest.raises(ConfigError, match="init.source"):
    runtime.model_config(get("attribute_model", "llama3_70b_helpsteer2"))
  c = get("attribute_model", "llama3_1_70b_scaled_bt")
  with pytest.raises(ConfigError, match="init.source"):
    attribute_model.check_config(c)
  c.init.source = "/runs/attribute_model"
  with pytest.raises(ConfigError, match="tokenizer"):
    attribute_model.check_config(c)
  c = get("attribute_model")
  c.loss = "hinge"
  with pytest.raises(ConfigError, match="regular_bt"):
    attribute_model.check_config(c)


@pytest.mark.parametrize("task", ["evaluate_rm", "annotate", "build_2d"])
def test_scoring_task_presets(task):
  demo = get(task)
  assert demo.scorer.model.name == get("attribute_model").model.name
  assert demo.scorer.model.hidden_size is None  # the demo run's shapes are read from it
  assert demo.scorer.source == "workdir/attribute_model" and "model" not in demo
  big = get(task, "llama3_70b")
  assert big.scorer.model.name == "llama3_70b" and big.scorer.model.dtype == "bfloat16"
  with pytest.raises(ValueError, match="llama2_13b"):
    get(task, "gpt2")
