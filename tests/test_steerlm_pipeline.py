"""SteerLM end to end on the demo data: attribute model -> annotation -> AC-SFT,
plus Bradley-Terry from the regression head, evaluation, and backbone init
from an AC-SFT checkpoint. Tiny model, a few steps each, in-process."""

import json

import jax
import numpy as np
import pytest

from helpsteer_jax import runtime, saved_params
from helpsteer_jax.data.formats import helpsteer as readers
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.data.template import parse_label_string
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.load import reward as reward_model
from helpsteer_jax.tasks import acsft, annotate, attribute_model, evaluate_rm

from task_configs import short_config

config = short_config


@pytest.fixture(scope="module")
def regression_run(attribute_model_run):
  """The session's regression attribute-model run and its summary."""
  return attribute_model_run, json.loads((attribute_model_run / "summary.json").read_text())


def test_attribute_model_annotation_then_acsft(regression_run, tmp_path):
  rm_dir, summary = regression_run
  assert summary["status"] == "finished" and summary["step"] == 4
  assert set(summary["validation"]["attributes"]) == set(ATTRIBUTES[4:])
  assert (rm_dir / "head.npz").exists() and (rm_dir / "checkpoints" / "4").is_dir()

  out = tmp_path / "annotated.jsonl"
  ann = config("annotate", scorer={"source": str(rm_dir)},
               data={"output_path": str(out), "max_rows": 20, "chunk_rows": 8,
                     "input_path": str(rm_dir / "demo_data")})
  ann.scorer.tokenizer = str(rm_dir / "demo_tokenizer")
  counts = annotate.run(ann, str(tmp_path / "annotate"))
  assert counts["written"] == 20 and counts["unscored_turns"] == 0
  convs = readers.read_steerlm_conversations(out)
  assert len(convs) == 20
  labels = [parse_label_string(t.label) for c in convs for t in c.turns if t.role == "Assistant"]
  assert labels and all(list(lab) == list(ATTRIBUTES) for lab in labels)

  sft = config("acsft", data={"train_path": str(out), "format": "steerlm"})
  sft.tokenizer = str(rm_dir / "demo_tokenizer")
  result = acsft.run(sft, str(tmp_path / "acsft"))
  assert result["status"] == "finished" and np.isfinite(result["train"]["loss"])

  # The AC-SFT checkpoint initialises an attribute model's backbone (head from zeros).
  init = config("attribute_model", init={"source": str(tmp_path / "acsft")})
  rt = runtime.setup(init)
  model = reward_model.build_reward_model(init, rt)
  saved, _ = saved_params.restore_params(tmp_path / "acsft", jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
      {"final_norm": {"scale": model.backbone.final_norm.scale[...]}}))
  np.testing.assert_array_equal(np.asarray(model.backbone.final_norm.scale[...]),
                                np.asarray(saved["final_norm"]["scale"]))
  assert not np.any(np.asarray(model.head.kernel[...]))


def test_scaled_bt_from_the_regression_head_and_evaluation(regression_run, tmp_path):
  rm_dir, _ = regression_run
  bt = config("attribute_model", init={"source": str(rm_dir)},
              data={"packing": False})
  bt.loss = "scaled_bt"
  bt.tokenizer = str(rm_dir / "demo_tokenizer")
  with pytest.raises(ConfigError, match="packing=False"):
    attribute_model.check_config(_with_loss(config("attribute_model"), "margin_bt"))
  rt = runtime.setup(bt)
  start = reward_model.build_reward_model(bt, rt)
  head = np.load(rm_dir / "head.npz")
  np.testing.assert_allclose(np.asarray(start.head.kernel[...]), head["kernel"])
  summary = attribute_model.run(bt, str(tmp_path / "bt"))
  assert summary["status"] == "finished"
  assert 0.0 <= summary["validation"]["pairs"]["accuracy"] <= 1.0
  assert "accuracy" in summary["train"]

  rewardbench = tmp_path / "rb.jsonl"
  rows = [{"prompt": f"What is {i} plus 1?", "chosen": f"{i} plus 1 is {i + 1}.",
           "rejected": f"{i} plus 1 is {i + 3}.", "subset": s}
          for i, s in enumerate(["alpacaeval-easy", "math-prm", "hep-go", "donotanswer"] * 2)]
  rewardbench.write_text("".join(json.dumps(r) + "\n" for r in rows))
  ev = config("evaluate_rm", scorer={"source": str(rm_dir)},
              data={"rewardbench_path": str(rewardbench),
                    "validation_path": str(rm_dir / "demo_data"),
                    "preference_path": str(tmp_path / "bt" / "demo_data")})
  ev.scorer.tokenizer = str(rm_dir / "demo_tokenizer")
  report = evaluate_rm.run(ev, str(tmp_path / "eval"))
  assert set(report["attributes"]) == set(ATTRIBUTES[4:])
  assert report["helpsteer2_preference"]["count"] > 0
  assert set(report["rewardbench"]["by_subset"]) == {r["subset"] for r in rows}
  assert set(report["rewardbench"]["sections"]) == {"Chat", "Reasoning", "Safety", "Score"}
  assert (tmp_path / "eval" / "rm_attributes.png").stat().st_size > 1000
  saved = json.loads((tmp_path / "eval" / "rm_report.json").read_text())
  assert saved["rewardbench"]["count"] == len(rows)


def _with_loss(cfg, loss):
  cfg.loss = loss
  return cfg


def test_annotation_and_evaluation_need_a_trained_model(tmp_path):
  for task, module in (("annotate", annotate), ("evaluate_rm", evaluate_rm)):
    cfg = config(task, scorer={"source": ""})
    with pytest.raises(ConfigError, match="scorer.source"):
      module.run(cfg, str(tmp_path))
