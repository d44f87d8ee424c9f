"""Preference readers (HelpSteer2-Preference, RewardBench), bad rows, reward-model features."""

import json

import numpy as np
import pytest

from helpsteer_jax.data import pipeline, records
from helpsteer_jax.data.demo import rows as demo
from helpsteer_jax.data.demo.tokenizer import build_demo_tokenizer
from helpsteer_jax.data.features import regression_ids as rid
from helpsteer_jax.data.features import rm as rm_data
from helpsteer_jax.data.formats import helpsteer as readers
from helpsteer_jax.data.formats import preference
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.data.template import DEFAULT_SYSTEM, regression_text
from helpsteer_jax.errors import DataError
from helpsteer_jax.models import hf


def pref(**kw):
  return {"split": "train", "prompt": "What is 2 plus 2?", "response_1": "It is 4.",
          "response_2": "It is 5.", "preference_strength": -2, **kw}


def write(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return path


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return hf.load_tokenizer(build_demo_tokenizer(tmp_path_factory.mktemp("tok") / "t"))


def test_helpsteer2_pairs_put_the_better_response_first(tmp_path):
  rows = [pref(preference_strength=-2), pref(preference_strength=3, split="validation"),
          pref(preference_strength=0)]
  path = write(tmp_path / "p.jsonl", rows)
  pairs = preference.read_helpsteer2_preference(path)
  assert [p.strength for p in pairs] == [2, 3, 0]
  assert pairs[0].chosen.turns[-1].text == "It is 4."   # negative: response 1 better
  assert pairs[1].chosen.turns[-1].text == "It is 5."
  assert pairs[1].source == f"{path}:2"
  assert regression_text(pairs[0].rejected).endswith("It is 5.\n<extra_id_2>")
  assert len(preference.read_helpsteer2_preference(path, split="validation")) == 1


def test_helpsteer2_directory_layout_as_the_hub_ships_it(tmp_path):
  demo.write_demo_preference(tmp_path, num_train=20, num_validation=5)
  assert len(preference.read_helpsteer2_preference(tmp_path, split="train")) == 20
  val = preference.read_helpsteer2_preference(tmp_path, split="validation")
  assert len(val) == 5 and all(p.subset == "validation" for p in val)


@pytest.mark.parametrize("bad,reason", [
    (pref(preference_strength=4), "preference_strength outside -3..3"),
    (pref(preference_strength=-5), "preference_strength outside -3..3"),
    (pref(preference_strength=1.5), "preference_strength not an integer"),
    (pref(preference_strength="2"), "preference_strength not an integer"),
    (pref(response_2=None), "missing field 'response_2'"),
    (pref(response_1="  "), "empty response_1"),
    ("{not json", "malformed JSON"),
])
def test_bad_preference_rows_name_file_and_line(tmp_path, bad, reason):
  path = write(tmp_path / "p.jsonl", [pref(), bad, pref()])
  with pytest.raises(DataError, match=f"p.jsonl:2: .*{reason}"):
    preference.read_helpsteer2_preference(path)
  report = BadRecordReport()
  pairs = preference.read_helpsteer2_preference(path, on_bad_record="skip", report=report)
  assert len(pairs) == 2 and report.total == 1 and f"{path}:2" in report.summary()


def test_a_label_score_outside_0_4_is_a_bad_row(tmp_path):
  conv = {"system": "S", "mask": "User", "conversations": [
      {"from": "User", "value": "q"}, {"from": "Assistant", "value": "a",
                                       "label": "helpfulness:5"}]}
  path = write(tmp_path / "c.jsonl", [conv])
  with pytest.raises(DataError, match="c.jsonl:1: .*outside 0..4"):
    readers.read_records(path)


def test_rewardbench_rows_and_bad_rows(tmp_path):
  good = {"prompt": "Say hi.", "chosen": "Hi!", "rejected": "No.", "subset": "alpacaeval-easy",
          "id": 3}
  path = write(tmp_path / "rb.jsonl", [good, {**good, "subset": None}])
  with pytest.raises(DataError, match="rb.jsonl:2: missing field 'subset'"):
    preference.read_rewardbench(path)
  pairs = preference.read_rewardbench(path, on_bad_record="skip")
  assert len(pairs) == 1 and pairs[0].subset == "alpacaeval-easy"
  assert pairs[0].chosen.turns[-1].text == "Hi!" and pairs[0].rejected.turns[-1].text == "No."


def test_regression_features_end_in_label_start_and_pack(tokenizer, tmp_path):
  convs = readers.read_records(demo.write_demo_dataset(tmp_path, 12, 2))
  feats, report = rm_data.regression_features(convs, tokenizer, seq_len=128)
  assert report.kept == 12 and report.loss_tokens == 60
  label_start = tokenizer.convert_tokens_to_ids("<extra_id_2>")
  for f, conv in zip(feats, convs):
    assert f["inputs"][-1] == label_start and f["readout"][-1] == 1 and f["readout"].sum() == 1
    want = rid.label_vector(conv.attributes)
    np.testing.assert_array_equal(f["labels"][-1], want)
    assert (f["labels"][:-1] == records.IGNORE_LABEL).all()
  assert want[:4].tolist() == [records.IGNORE_LABEL] * 4  # HelpSteer fills slots 4..8
  batch = next(iter(pipeline.training_dataset(feats, pipeline.PipelineConfig(128, 2))))
  assert batch["labels"].shape == (2, 128, len(ATTRIBUTES))
  # every packed sequence keeps exactly one readout, at its last token
  for row in range(2):
    seg, ro = batch["segment_ids"][row], batch["readout"][row]
    for s in set(seg[seg > 0].tolist()):
      last = np.flatnonzero(seg == s)[-1]
      assert ro[last] == 1 and ro[seg == s].sum() == 1


def test_pair_features_are_two_segments_in_one_padded_row(tokenizer, tmp_path):
  pairs = preference.read_helpsteer2_preference(write(tmp_path / "p.jsonl", [
      pref(), pref(preference_strength=0), pref(preference_strength=1)]))
  feats, report = rm_data.bt_features(pairs, tokenizer, seq_len=128)
  assert report.kept == 2 and report.dropped["tie"] == 1  # the tie is not trained on
  f = feats[1]
  n_c = int(np.sum(f["segment_ids"] == 1))
  assert f["pair"][n_c - 1] == records.CHOSEN and f["pair"][-1] == records.REJECTED
  assert f["margin"][n_c - 1] == 1 and f["positions"][n_c] == 0
  with pytest.raises(ValueError, match="packing"):
    next(iter(pipeline.training_dataset(feats, pipeline.PipelineConfig(128, 2, packing=True))))
  batch = next(iter(pipeline.training_dataset(feats, pipeline.PipelineConfig(128, 2,
                                                                             packing=False))))
  assert set(batch["segment_ids"][0].tolist()) <= {0, 1, 2}


def test_regression_truncation_keeps_the_last_response_and_label_start(tokenizer):
  turns = (Turn("User", "word " * 200), Turn("Assistant", "The answer is 4."))
  conv = Conversation(DEFAULT_SYSTEM, turns)
  full, _ = rid.regression_ids(conv, tokenizer, 10_000)
  ids, truncated = rid.regression_ids(conv, tokenizer, 64)
  assert truncated and len(ids) == 64 and ids[0] == tokenizer.bos_token_id
  np.testing.assert_array_equal(ids[1:], full[-63:])
  assert tokenizer.decode(ids[-12:]).endswith("The answer is 4.\n<extra_id_2>")
  assert rid.regression_ids(conv, tokenizer, 64, truncation="drop") == (None, False)
  assert rid.regression_ids(conv, tokenizer, 8)[0] is None  # the response itself is too long
