"""HelpSteer2-Preference's reward-model recipe: Scaled Bradley-Terry starting from the regression
attribute model (its backbone, its helpfulness head row as the reward), the demo preset for
it, and evaluate_rm's one table of several reward models (variants). Tiny model, 4 steps."""

import json
import runpy

import numpy as np
import pytest

from helpsteer_jax import runtime
from helpsteer_jax.data.demo import rows as demo_rows
from helpsteer_jax.data.features import regression_ids as rid
from helpsteer_jax.data.formats import helpsteer as readers
from helpsteer_jax.data.formats import preference
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.load import reward as reward_model
from helpsteer_jax.models import hf
from helpsteer_jax.scoring import evaluate as rm_eval
from helpsteer_jax.scoring import rewards
from helpsteer_jax.scoring.load import load_scorer
from helpsteer_jax.scoring.model import ModelScorer
from helpsteer_jax.tasks import attribute_model, evaluate_rm

from conftest import REPO_ROOT
from task_configs import short_config

HELPFULNESS = ATTRIBUTES.index("helpfulness")


@pytest.fixture(scope="module")
def regression(attribute_model_run):
  """The session's regression attribute-model run with its HF export."""
  return attribute_model_run


def test_demo_scaled_bt_preset_starts_from_the_demo_regression_run():
  get_config = runpy.run_path(str(REPO_ROOT / "configs" / "attribute_model.py"))["get_config"]
  regression, bt = get_config("demo"), get_config("demo_scaled_bt")
  attribute_model.check_config(bt)
  assert bt.loss == "scaled_bt" and bt.init.source == "workdir/attribute_model"
  assert bt.init.head == "auto" and bt.bt_attribute == "helpfulness"
  assert bt.workdir == "workdir/attribute_model_bt" and not bt.data.packing
  assert bt.model.to_dict() == regression.model.to_dict()  # the regression run's shape
  bt.init.source = ""
  with pytest.raises(ConfigError, match="init.source"):
    attribute_model.check_config(bt)


def test_bt_from_regression_starts_from_its_backbone_and_helpfulness_row(regression):
  """The BT run's model at step 0 (built as attribute_model.run builds it) is the regression
  model: its rewards, the helpfulness slot, are the regression's helpfulness predictions."""
  cfg = short_config("attribute_model", init={"source": str(regression)})
  cfg.loss, cfg.data.packing = "scaled_bt", False
  attribute_model.check_config(cfg)
  rt = runtime.setup(cfg)
  bt = reward_model.build_reward_model(cfg, rt)
  tokenizer = hf.load_tokenizer(regression / "demo_tokenizer")
  bt_scorer = ModelScorer(bt, rt, rid.RegressionTokenizer(tokenizer, 128), 8)
  scorer_cfg = short_config("evaluate_rm", scorer={"source": str(regression)})
  reg_scorer = load_scorer(scorer_cfg.scorer, rt)
  convs = readers.read_records(regression / "demo_data", "validation")[:8]
  bt_rewards = rewards.rewards(bt_scorer(convs), np.eye(len(ATTRIBUTES))[HELPFULNESS])
  regression_helpfulness = reg_scorer(convs)[:, HELPFULNESS]
  np.testing.assert_allclose(bt_rewards, regression_helpfulness, atol=1e-6, rtol=0)
  assert np.ptp(regression_helpfulness) > 1e-3  # a trained head, not zeros
  np.testing.assert_array_equal(np.asarray(bt.head.kernel[...]),
                                reward_model.load_head(regression / "head.npz", 64)["kernel"])


def test_evaluate_rm_variants_one_table(regression, tmp_path, capsys):
  """variants: one row per reward model with HelpSteer2-Preference accuracy and the
  RewardBench sections of the demo pairs; `@helpfulness` reads that slot alone, the
  others weigh by scorer.weights; the HF export scores as its Orbax run."""
  spec = (f"regression={regression},bt={regression}@helpfulness,"
          f"bt_hf={regression / 'hf'}@helpfulness")
  cfg = short_config("evaluate_rm")
  cfg.variants = spec
  report = evaluate_rm.run(cfg, str(tmp_path / "eval"))
  table = capsys.readouterr().out
  assert list(report["variants"]) == ["regression", "bt", "bt_hf"]
  assert "| variant | reward | HelpSteer2-Preference | RB Chat |" in table
  assert "| bt | helpfulness |" in table and "| regression | scorer.weights |" in table
  saved = json.loads((tmp_path / "eval" / "rm_report.json").read_text())
  assert set(saved["variants"]) == set(report["variants"])
  bt, bt_hf = report["variants"]["bt"], report["variants"]["bt_hf"]
  for name in ("helpsteer2_preference", "rewardbench"):
    assert bt[name]["accuracy"] == pytest.approx(bt_hf[name]["accuracy"])
  assert {"Chat", "Chat Hard", "Reasoning", "Score"} <= set(bt["rewardbench"]["sections"])
  # The regression row: the pairs scored by its scorer with HelpSteer2's weights.
  pairs = preference.read_helpsteer2_preference(tmp_path / "eval" / "demo_data",
                                                "validation")
  scorer = load_scorer(short_config("evaluate_rm", scorer={"source": str(regression)}).scorer,
                       runtime.setup(cfg))
  weights = [cfg.scorer.weights[a] for a in ATTRIBUTES]
  want = rm_eval.evaluate_pairs(scorer, pairs, weights)["accuracy"]
  assert report["variants"]["regression"]["helpsteer2_preference"]["accuracy"] == want
  rb = preference.read_rewardbench(tmp_path / "eval" / "demo_data" / "rewardbench")
  assert len(rb) == sum(p.strength != 0 for p in pairs)
  assert {p.subset for p in rb} <= {"math-prm", "alpacaeval-easy", "llmbar-natural"}
  assert demo_rows.rewardbench_subset(
      {"prompt": "What is 3 plus 4?", "preference_strength": 1}) == "math-prm"
  with pytest.raises(ConfigError, match="variants"):
    evaluate_rm.parse_variants("a=workdir/nowhere")
  with pytest.raises(ConfigError, match="attribute 'nope'"):
    evaluate_rm.parse_variants(f"a={regression}@nope")
