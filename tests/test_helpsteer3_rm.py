"""The preference RM on HelpSteer3: scaled Bradley-Terry on the existing BT path, with
|overall_preference| as the strength and ties dropped, domain and language filters, and
the evaluator's per-domain accuracy on the same files."""

import gzip
import json

import numpy as np
import pytest

from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.features import rm as rm_data
from helpsteer_jax.data.formats import helpsteer3
from helpsteer_jax.data.records import CHOSEN, REJECTED
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import hf
from helpsteer_jax.tasks import attribute_model, evaluate_rm

from task_configs import short_config

DOMAINS = ("general", "code", "stem", "multilingual")


def _rows(n: int, offset: int = 0) -> list[dict]:
  """Arithmetic questions in HelpSteer3-Preference's schema: the right sum against a wrong
  one on either side, strengths 1..3, every fifth row a tie; some with an earlier turn."""
  rows = []
  for i in range(offset, offset + n):
    right, wrong = f"{i} plus 2 is {i + 2}.", f"{i} plus 2 is {i + 7}."
    strength = 0 if i % 5 == 4 else 1 + i % 3
    first = i % 2 == 0
    context = [{"role": "user", "content": f"What is {i} plus 2?"}]
    if i % 3 == 0:
      context = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"},
                 *context]
    rows.append({
        "domain": DOMAINS[i % 4], "language": "english" if i % 4 != 3 else "german",
        "context": context,
        "response1": right if first else wrong, "response2": wrong if first else right,
        "overall_preference": -strength if first else strength,
        "individual_preference": [{"score": -strength if first else strength,
                                   "reasoning": "The right sum."}]})
  return rows


def _write(root, split, rows):
  path = root / "preference" / f"{split}.jsonl.gz"
  path.parent.mkdir(parents=True, exist_ok=True)
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def hs3_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("hs3")
  _write(root, "train", _rows(40))
  _write(root, "validation", _rows(16, offset=100))
  return root


def test_pairs_put_the_better_response_first_with_strength_and_ties_dropped(hs3_dir,
                                                                             tmp_path):
  rows = _rows(40)
  pairs = helpsteer3.read_preference_pairs(hs3_dir, "train")
  assert [p.strength for p in pairs] == [abs(r["overall_preference"]) for r in rows]
  for p, r in zip(pairs, rows):
    right = f"plus 2 is {int(r['context'][-1]['content'].split()[2]) + 2}."
    if r["overall_preference"]:  # a tie keeps response 1 first
      assert p.chosen.turns[-1].text.endswith(right)
    assert p.subset == r["domain"]
    assert len(p.chosen.turns) == len(r["context"]) + 1
  tok = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path / "tok"))
  features, report = rm_data.bt_features(pairs, tok, seq_len=256)
  kept = [p for p in pairs if p.strength]
  assert len(features) == len(kept) and report.as_dict()["dropped"] == {"tie": 8}
  for f, p in zip(features, kept):  # scaled BT's weight sits on the chosen end
    (end,) = np.flatnonzero(f["pair"] == CHOSEN)
    assert f["margin"][end] == p.strength and f["margin"].sum() == p.strength
    assert np.flatnonzero(f["pair"] == REJECTED) == [len(f["pair"]) - 1]


def test_filters_keep_the_listed_domains_and_languages(hs3_dir):
  code = helpsteer3.read_preference_pairs(hs3_dir, domains=("code", "stem"))
  assert {p.subset for p in code} == {"code", "stem"} and len(code) == 20
  german = helpsteer3.read_preference_pairs(hs3_dir, languages=helpsteer3.filter_list(
      " german ,"))
  assert {p.subset for p in german} == {"multilingual"}


def test_format_checks_fail_before_any_work():
  bt = short_config("attribute_model", data={"format": "helpsteer3", "packing": False})
  with pytest.raises(ConfigError, match="not attribute labels"):
    attribute_model.check_config(bt)
  bt.loss = "scaled_bt"
  attribute_model.check_config(bt)
  bt.data.format = "steerlm"
  with pytest.raises(ConfigError, match="HelpSteer3's preference config"):
    attribute_model.check_config(bt)
  bt.data.update(format="auto", domains="code")
  with pytest.raises(ConfigError, match="format=helpsteer3"):
    attribute_model.check_config(bt)


def test_scaled_bt_trains_on_helpsteer3_and_the_evaluator_reports_each_domain(hs3_dir,
                                                                              tmp_path):
  """Scaled BT from scratch on the HelpSteer3 files, code and general only: the
  validation pairs are those domains' non-tie rows; then evaluate_rm on every domain."""
  bt = short_config("attribute_model", data={
      "format": "helpsteer3", "packing": False, "train_path": str(hs3_dir),
      "validation_path": str(hs3_dir), "domains": "code,general"})
  bt.loss = "scaled_bt"
  bt.train.update(num_steps=6, seq_len=128)
  summary = attribute_model.run(bt, str(tmp_path / "bt"))
  assert summary["status"] == "finished"
  val = [r for r in _rows(16, offset=100) if r["domain"] in ("code", "general")
         and r["overall_preference"]]
  assert summary["validation"]["pairs"]["count"] == len(val)
  assert set(summary["validation"]["pairs"]["by_subset"]) == {"code", "general"}

  ev = short_config("evaluate_rm", scorer={"source": str(tmp_path / "bt")},
                    data={"helpsteer3_path": str(hs3_dir)})
  for name in ev.scorer.weights:  # the BT model's reward: its bt_attribute slot
    ev.scorer.weights[name] = float(name == "helpfulness")
  report = evaluate_rm.run(ev, str(tmp_path / "eval"))
  assert set(report) >= {"helpsteer3_preference"}
  assert "helpsteer2_preference" not in report and "rewardbench" not in report
  result = report["helpsteer3_preference"]
  assert result["count"] == sum(1 for r in _rows(16, offset=100) if r["overall_preference"])
  assert set(result["by_subset"]) == set(DOMAINS)
  # The same model on the same conversations as training's final evaluation.
  for domain, m in summary["validation"]["pairs"]["by_subset"].items():
    assert result["by_subset"][domain] == pytest.approx(m), domain
