"""HelpSteer3's five configs read as the hub ships them (`<config>/<split>.jsonl.gz`, the
card's field names), written here: records, pair order and ties, the feedback's
helpfulness levels, domain and language filters, and bad rows named by file and line."""

import gzip
import json

import pytest

from helpsteer_jax.data.formats import helpsteer3
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.errors import ConfigError, DataError

CONTEXT = [{"role": "user", "content": "Write a haiku about rain."},
           {"role": "assistant", "content": "Rain taps the window..."},
           {"role": "user", "content": "Now one about snow."}]


def _base(domain="general", language="english", context=CONTEXT):
  return {"domain": domain, "language": language, "context": context}


ROWS = {
    "preference": [
        {**_base(), "response1": "Snow falls soft.", "response2": "Snow is cold.",
         "overall_preference": -2,
         "individual_preference": [{"score": -2, "reasoning": "1 is a haiku."},
                                   {"score": -1, "reasoning": "1 is better."}]},
        {**_base("code", "python"), "response1": "a", "response2": "b",
         "overall_preference": 3, "individual_preference": [{"score": 3, "reasoning": "."}]},
        {**_base("stem"), "response1": "x", "response2": "y", "overall_preference": 0,
         "individual_preference": []},
    ],
    "feedback": [
        {**_base(), "response1": "Snow falls soft.", "response2": "Snow is cold.",
         "feedback1": ["The response is mostly helpful. It is a haiku.",
                       "The response is perfectly helpful."],
         "feedback2": ["The response is not helpful: no haiku."]},
        {**_base("multilingual", "chinese"), "response1": "a", "response2": "b",
         "feedback1": ["No level stated here."], "feedback2": ["the response is SLIGHTLY helpful"]},
    ],
    "edit": [
        {**_base(), "original_response": "Snow is cold.", "edited_response": "Snow falls soft.",
         "feedback": ["The response is slightly helpful. Not a haiku."],
         "change_summary": "Rewrote it as a haiku."},
    ],
    "edit_quality": [
        {**_base(), "original_response": "Snow is cold.",
         "good_edited_response": "Snow falls soft.", "bad_edited_response": "Snow, cold snow.",
         "feedback": ["The response is slightly helpful."]},
    ],
    "principle": [
        {**_base(), "response": "Snow falls soft.", "principle": "The response is a haiku.",
         "fulfilment": "Yes"},
        {**_base(), "response": "Snow is cold.", "principle": "The response is a haiku.",
         "fulfilment": "No"},
    ],
}


def write_rows(root, config, rows, split="train"):
  """`rows` (objects, or raw lines) as HelpSteer3's `<config>/<split>.jsonl.gz` under `root`."""
  path = root / config / f"{split}.jsonl.gz"
  path.parent.mkdir(parents=True, exist_ok=True)
  with gzip.open(path, "wt", encoding="utf-8") as f:
    for row in rows:
      f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
  return path


@pytest.fixture
def hs3(tmp_path):
  for config, rows in ROWS.items():
    write_rows(tmp_path, config, rows)
    write_rows(tmp_path, config, rows[:1], "validation")
  return tmp_path


def test_preference_rows_become_pairs_better_first_with_their_strength(hs3):
  rows = helpsteer3.read_helpsteer3(hs3, "preference")
  assert [r.overall for r in rows] == [-2, 3, 0]
  assert rows[0].individual == (-2, -1)
  pairs = [r.pair for r in rows]
  assert [p.chosen.turns[-1].text for p in pairs] == ["Snow falls soft.", "b", "x"]
  assert [p.rejected.turns[-1].text for p in pairs] == ["Snow is cold.", "a", "y"]
  assert [p.strength for p in pairs] == [2, 3, 0]  # the tie kept: training drops strength 0
  assert [p.subset for p in pairs] == ["general", "code", "stem"]
  conv = pairs[0].chosen
  assert [(t.role, t.trainable) for t in conv.turns] == [
      ("User", True), ("Assistant", False), ("User", True), ("Assistant", True)]
  assert conv.source.endswith("preference/train.jsonl.gz:1")
  assert len(helpsteer3.read_helpsteer3(hs3, "preference", "validation")) == 1


def test_feedback_helpfulness_is_the_mean_level_its_strings_state(hs3):
  rows = helpsteer3.read_helpsteer3(hs3, "feedback")
  assert rows[0].helpfulness == (4.5, 1.0)  # (mostly 4 + perfectly 5) / 2, not 1
  assert rows[1].helpfulness == (None, 2.0)  # no level stated; case ignored
  assert rows[0].feedback[1] == ("The response is not helpful: no haiku.",)
  assert helpsteer3.helpfulness(["The response is partially helpful."]) == 3.0


def test_edit_edit_quality_and_principle_records(hs3):
  edit = helpsteer3.read_helpsteer3(hs3, "edit")[0]
  assert (edit.original, edit.edited, edit.change_summary) == (
      "Snow is cold.", "Snow falls soft.", "Rewrote it as a haiku.")
  quality = helpsteer3.read_helpsteer3(hs3, "edit_quality")[0]
  assert quality.pair.chosen.turns[-1].text == "Snow falls soft."
  assert quality.pair.rejected.turns[-1].text == "Snow, cold snow."
  principle = helpsteer3.read_helpsteer3(hs3, "principle")
  assert [p.fulfilled for p in principle] == [True, False]
  assert principle[0].principle == "The response is a haiku."


def test_domain_and_language_filters_and_sources(hs3):
  read = helpsteer3.read_helpsteer3
  assert [r.context.domain for r in read(hs3, "preference", domains=("code", "stem"))] == [
      "code", "stem"]
  assert [r.context.language for r in read(hs3, "feedback", languages=("chinese",))] == [
      "chinese"]
  # the config's directory and the file itself read the same rows
  assert len(read(hs3 / "preference", "preference")) == 3
  assert len(read(hs3 / "preference" / "train.jsonl.gz", "preference")) == 3
  with pytest.raises(ConfigError, match="expected one of preference, feedback"):
    read(hs3, "ranking")


def test_a_system_message_is_the_conversation_system_prompt(tmp_path):
  row = {**ROWS["principle"][0],
         "context": [{"role": "system", "content": "Be brief."}, *CONTEXT]}
  write_rows(tmp_path, "principle", [row])
  conv = helpsteer3.read_helpsteer3(tmp_path, "principle")[0].context.conversation
  assert conv.system == "Be brief." and len(conv.turns) == 3


@pytest.mark.parametrize("change, reason", [
    ({"overall_preference": 4}, "overall_preference outside -3..3"),
    ({"overall_preference": "2"}, "overall_preference is not an integer"),
    ({"context": []}, "context is not a non-empty list"),
    ({"context": CONTEXT[:2]}, "does not end with a user turn"),
    ({"context": [{"role": "tool", "content": "x"}]}, "role must be user or assistant"),
    ({"response2": ""}, "empty response2"),
    ({"individual_preference": [{"reasoning": "no score"}]}, "individual_preference"),
])
def test_a_bad_preference_row_names_its_file_and_line(tmp_path, change, reason):
  path = write_rows(tmp_path, "preference", [ROWS["preference"][0],
                                         {**ROWS["preference"][0], **change}])
  with pytest.raises(DataError, match=reason) as e:
    helpsteer3.read_helpsteer3(tmp_path, "preference")
  assert f"{path}:2" in str(e.value)
  report = BadRecordReport()
  kept = helpsteer3.read_helpsteer3(tmp_path, "preference", on_bad_record="skip",
                                    report=report)
  assert len(kept) == 1 and report.total == 1


def test_bad_rows_of_the_other_configs(tmp_path):
  write_rows(tmp_path, "principle", [{**ROWS["principle"][0], "fulfilment": "Maybe"}])
  with pytest.raises(DataError, match="fulfilment is neither Yes nor No"):
    helpsteer3.read_helpsteer3(tmp_path, "principle")
  write_rows(tmp_path, "feedback", [{**ROWS["feedback"][0], "feedback1": [3]}, "{not json"])
  report = BadRecordReport()
  assert helpsteer3.read_helpsteer3(tmp_path, "feedback", on_bad_record="skip",
                                    report=report) == []
  assert report.total == 2
