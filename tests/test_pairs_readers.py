"""HelpSteer-2D JSONL / CSV readers and plain preference pairs: every validation error."""

import copy
import csv
import json

import numpy as np
import pytest

from helpsteer_jax.data.demo import pairs_2d as demo_2d
from helpsteer_jax.data.formats import helpsteer_2d as pairs
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.errors import ConfigError, DataError

GOOD = demo_2d.demo_pairs(1, seed=0)[0]


def _write_jsonl(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return path


def _bad(mutate):
  row = copy.deepcopy(GOOD)
  mutate(row)
  return row


def _set(path, value):
  def mutate(row):
    node = row
    for key in path[:-1]:
      node = node[key]
    node[path[-1]] = value
  return mutate


def _delete(path):
  def mutate(row):
    node = row
    for key in path[:-1]:
      node = node[key]
    del node[path[-1]]
  return mutate


JSONL_CASES = [
    ("{not json", "malformed JSON"),
    ("[1, 2]", "not a JSON object"),
    (_bad(_delete(["prompt"])), "missing field 'prompt'"),
    (_bad(_set(["chosen"], "  ")), "empty chosen"),
    (_bad(_set(["rejected"], 3)), "wrong type for 'rejected'"),
    (_bad(_delete(["chosen_segments"])), "missing field 'chosen_segments'"),
    (_bad(_set(["chosen_segments"], [])), "'chosen_segments' is not a non-empty list"),
    (_bad(_set(["rejected_segments", 0], {"scores": {}})), "segment without text"),
    (_bad(_delete(["rejected_segments", 0, "scores"])), "segment without scores"),
    (_bad(_delete(["chosen_segments", 0, "scores", "safety"])), "segment misses aspects"),
    (_bad(_set(["chosen_segments", 0, "scores", "clarity"], True)), "score not a number"),
    (_bad(_set(["chosen_segments", 0, "scores", "clarity"], "4")), "score not a number"),
    (_bad(_set(["chosen_segments", 0, "scores", "clarity"], 5)), "score outside 0..4"),
    (_bad(_set(["chosen_segments", 0, "text"], "Different. ")), "segments do not tile"),
    (_bad(lambda r: r["chosen_segments"].pop()), "segments do not tile"),
]


@pytest.mark.parametrize("bad_row, reason", JSONL_CASES)
def test_jsonl_validation_errors_name_file_and_line(tmp_path, bad_row, reason):
  path = _write_jsonl(tmp_path / "d.jsonl", [GOOD, GOOD, bad_row])
  with pytest.raises(DataError, match=reason) as e:
    pairs.read_2d(path)
  assert e.value.path == str(path) and e.value.line == 3
  report = BadRecordReport()
  kept = pairs.read_2d(path, on_bad_record="skip", report=report)
  assert len(kept) == 2 and report.total == 1


def test_jsonl_reads_scores_in_aspect_order(tmp_path):
  path = _write_jsonl(tmp_path / "d.jsonl", [GOOD])
  (pair,) = pairs.read_2d(path)
  assert pair.chosen.text == GOOD["chosen"]
  assert pair.chosen.segments == tuple(s["text"] for s in GOOD["chosen_segments"])
  expected = [[s["scores"][a] for a in pairs.ASPECTS_2D] for s in GOOD["chosen_segments"]]
  np.testing.assert_array_equal(pair.chosen.scores, expected)
  (pair,) = pairs.read_2d(path, aspects=("clarity",))
  assert pair.rejected.scores.shape == (len(GOOD["rejected_segments"]), 1)
  out = tmp_path / "again.jsonl"
  pairs.write_2d(out, [pair], ("clarity",))
  (again,) = pairs.read_2d(out, aspects=("clarity",))
  np.testing.assert_array_equal(again.rejected.scores, pair.rejected.scores)


def _write_csv(path, rows, header=pairs.CSV_COLUMNS):
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(rows)
  return path


CSV_GOOD = ["Say hi.", "Hi there. How are you?\nFine.", "No.", "[4, 3, 4]", "[0]"]


@pytest.mark.parametrize("column, value, reason", [
    (3, "[4, 3]", "score count differs from segment count"),
    (4, "[1, 2]", "score count differs from segment count"),
    (3, "[4, 3, oops]", "malformed score list"),
    (3, "4", "malformed score list"),
    (4, "[9]", "score outside 0..4"),
    (4, "", "missing field 'rejected segment scores'"),
    (0, "", "empty instruction"),
])
def test_csv_validation_errors(tmp_path, column, value, reason):
  bad = list(CSV_GOOD)
  bad[column] = value
  # The good first record spans two physical lines: the bad one starts on line 4.
  path = _write_csv(tmp_path / "d.csv", [CSV_GOOD, bad])
  with pytest.raises(DataError, match=reason) as e:
    pairs.read_2d(path)
  assert e.value.line == 4
  report = BadRecordReport()
  assert len(pairs.read_2d(path, on_bad_record="skip", report=report)) == 1
  assert report.total == 1


def test_csv_reads_one_score_per_segment(tmp_path):
  (pair,) = pairs.read_2d(_write_csv(tmp_path / "d.csv", [CSV_GOOD]))
  assert pair.chosen.segments == ("Hi there. ", "How are you?\n", "Fine.")
  np.testing.assert_array_equal(pair.chosen.scores, [[4], [3], [4]])
  assert pair.prompt == "Say hi."


def test_csv_without_a_column_and_unknown_files_fail(tmp_path):
  path = _write_csv(tmp_path / "d.csv", [CSV_GOOD[:4]], header=pairs.CSV_COLUMNS[:4])
  with pytest.raises(DataError, match="lacks column"):
    pairs.read_2d(path)
  with pytest.raises(ConfigError, match="does not exist"):
    pairs.read_2d(tmp_path / "missing.jsonl")
  (tmp_path / "d.txt").write_text("x")
  with pytest.raises(ConfigError, match="unsupported file type"):
    pairs.read_2d(tmp_path / "d.txt")


def test_plain_pairs_from_every_source(tmp_path, helpsteer2_sample):
  path = _write_jsonl(tmp_path / "p.jsonl", [
      {"prompt": "q", "chosen": "a", "rejected": "b"},
      {"prompt": "q", "response_1": "one", "response_2": "two", "preference_strength": -2},
      {"prompt": "q", "response_1": "one", "response_2": "two", "preference_strength": 1},
  ])
  got = pairs.read_plain_pairs(path)
  assert [(p.chosen, p.rejected) for p in got] == [("a", "b"), ("one", "two"), ("two", "one")]
  bad = _write_jsonl(tmp_path / "b.jsonl", [
      {"prompt": "q", "response_1": "one", "response_2": "two", "preference_strength": 0}])
  with pytest.raises(DataError, match="no preference"):
    pairs.read_plain_pairs(bad)
  bad = _write_jsonl(tmp_path / "c.jsonl", [{"prompt": "q", "chosen": "a"}])
  with pytest.raises(DataError, match="missing field 'rejected'"):
    pairs.read_plain_pairs(bad)
  rows = [json.loads(line) for line in helpsteer2_sample.read_text().splitlines()]
  got = pairs.read_plain_pairs(helpsteer2_sample)
  assert 0 < len(got) <= 50
  by_prompt = {}
  for r in rows:
    by_prompt.setdefault(r["prompt"], []).append(r)
  for p in got:
    scores = {r["response"]: r["helpfulness"] for r in by_prompt[p.prompt]}
    assert scores[p.chosen] > scores[p.rejected]
