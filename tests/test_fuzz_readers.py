"""Property-based bad input for every reader: each file either parses or raises
DataError naming the file (and line); in skip mode every row is either returned
or counted, never silently dropped."""

import csv
import gzip
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpsteer_jax.data.formats import helpsteer as readers
from helpsteer_jax.data.formats import helpsteer3, preference
from helpsteer_jax.data.formats import helpsteer_2d as pairs
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.records import HELPSTEER_ATTRIBUTES
from helpsteer_jax.errors import DataError

FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.integers(),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
                     st.just(""), st.just("x" * 200_000))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                       max_leaves=8)
_label = st.one_of(st.just("helpfulness:3,correctness:4"), st.text(max_size=30),
                   st.just("helpfulness:9"), st.just("quality:4,toxicity:0"))


def _row(keys, good):
  """A row mixing plausible values for the reader's keys with arbitrary junk."""
  return st.fixed_dictionaries({}, optional={
      **{k: st.one_of(good[k], _values) for k in keys},
      **{f"extra_{i}": _values for i in range(2)}})


_text = st.one_of(st.text(min_size=1, max_size=40), st.just("Hi <extra_id_1>User\nthere"))
_score = st.one_of(st.integers(0, 4), st.floats(0, 4), st.just(float("nan")))
HELPSTEER = _row(HELPSTEER_ATTRIBUTES + ("prompt", "response"),
                 {**{k: _score for k in HELPSTEER_ATTRIBUTES},
                  "prompt": _text, "response": _text})
_turn = st.fixed_dictionaries({"from": st.one_of(st.sampled_from(["User", "Assistant"]), _values),
                               "value": st.one_of(_text, _values)},
                              optional={"label": st.one_of(_label, _values)})
STEERLM = _row(("system", "conversations", "mask", "type"),
               {"system": _text, "conversations": st.lists(_turn, max_size=4),
                "mask": st.sampled_from(["User", "Assistant"]), "type": st.just("VALUE_TO_TEXT")})
HS2_PREFERENCE = _row(("prompt", "response_1", "response_2", "preference_strength", "split"),
                      {"prompt": _text, "response_1": _text, "response_2": _text,
                       "preference_strength": st.integers(-4, 4), "split": st.just("train")})
REWARDBENCH = _row(("prompt", "chosen", "rejected", "subset"),
                   {k: _text for k in ("prompt", "chosen", "rejected", "subset")})
_segment = st.fixed_dictionaries({"text": st.one_of(_text, _values),
                                  "scores": st.one_of(st.dictionaries(
                                      st.sampled_from(pairs.ASPECTS_2D), _score), _values)})
PAIRS_2D = _row(("prompt", "chosen", "rejected", "chosen_segments", "rejected_segments"),
                {"prompt": _text, "chosen": _text, "rejected": _text,
                 "chosen_segments": st.lists(_segment, max_size=3),
                 "rejected_segments": st.lists(_segment, max_size=3)})
_message = st.fixed_dictionaries({
    "role": st.one_of(st.sampled_from(["system", "user", "assistant"]), _values),
    "content": st.one_of(_text, _values)})
_context = st.one_of(st.lists(_message, max_size=4),
                     st.just([{"role": "user", "content": "Hi"}]))
_feedback = st.lists(st.one_of(st.just("The response is mostly helpful."), _text), max_size=3)
HS3_PREFERENCE = _row(("context", "response1", "response2", "overall_preference",
                       "individual_preference", "domain"),
                      {"context": _context, "response1": _text, "response2": _text,
                       "overall_preference": st.integers(-4, 4), "domain": _text,
                       "individual_preference": st.lists(st.fixed_dictionaries(
                           {"score": st.integers(-3, 3), "reasoning": _text}), max_size=2)})
HS3_FEEDBACK = _row(("context", "response1", "response2", "feedback1", "feedback2"),
                    {"context": _context, "response1": _text, "response2": _text,
                     "feedback1": _feedback, "feedback2": _feedback})
HS3_PRINCIPLE = _row(("context", "response", "principle", "fulfilment"),
                     {"context": _context, "response": _text, "principle": _text,
                      "fulfilment": st.sampled_from(["Yes", "No", " Yes", "maybe"])})
_garbage_line = st.one_of(st.just('{"prompt": "trunc'), st.just("[1, 2]"), st.just("null"),
                          st.just("[" * 5000), st.text(max_size=30))


def _lines(rows_and_garbage):
  out = []
  for item in rows_and_garbage:
    line = json.dumps(item) if isinstance(item, dict) else item
    out.append(line.replace("\n", " "))
  return out


def _nonblank(lines):
  # Blank as a JSON-lines file defines it: ASCII whitespace only. A line of
  # '\x1f' or '\u2028' (whitespace to str.strip) is a malformed record.
  return sum(1 for line in lines if line.encode("utf-8").strip())


def _check(read, path, nonblank):
  """Error mode: parses or DataError naming the file. Skip mode: kept + counted = rows."""
  try:
    read(path, "error", None)
  except DataError as e:
    assert str(path) in str(e)
  report = BadRecordReport()
  try:
    kept = read(path, "skip", report)
  except DataError as e:  # only whole-file damage (truncated gzip, bad CSV) stops skip mode
    assert str(path) in str(e)
    return
  assert len(kept) + report.total == nonblank


READERS = {
    "helpsteer": (HELPSTEER, lambda p, mode, rep: readers.read_helpsteer(p, on_bad_record=mode,
                                                                          report=rep)),
    "steerlm": (STEERLM, lambda p, mode, rep: readers.read_steerlm_conversations(
        p, on_bad_record=mode, report=rep)),
    "hs2_preference": (HS2_PREFERENCE, lambda p, mode, rep: preference.read_helpsteer2_preference(
        p, on_bad_record=mode, report=rep)),
    "rewardbench": (REWARDBENCH, lambda p, mode, rep: preference.read_rewardbench(
        p, on_bad_record=mode, report=rep)),
    "pairs_2d": (PAIRS_2D, lambda p, mode, rep: pairs.read_2d(p, on_bad_record=mode, report=rep)),
    **{f"hs3_{config}": (strategy, lambda p, mode, rep, config=config: helpsteer3.read_helpsteer3(
        p, config, on_bad_record=mode, report=rep)) for config, strategy in (
            ("preference", HS3_PREFERENCE), ("feedback", HS3_FEEDBACK),
            ("principle", HS3_PRINCIPLE))},
}


@pytest.mark.parametrize("name", sorted(READERS))
def test_jsonl_readers_parse_or_name_file_and_line(name, tmp_path):
  strategy, read = READERS[name]

  @FUZZ
  @given(st.lists(st.one_of(strategy, strategy, _garbage_line), min_size=1, max_size=6))
  def check(items):
    lines = _lines(items)
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    _check(read, path, _nonblank(lines))

  check()


@pytest.mark.parametrize("name", ["helpsteer", "pairs_2d"])
def test_truncated_gzip_parses_or_names_the_file(name, tmp_path):
  strategy, read = READERS[name]

  @FUZZ
  @given(st.lists(strategy, min_size=1, max_size=4), st.floats(0.0, 1.0))
  def check(rows, keep):
    data = gzip.compress(("\n".join(_lines(rows)) + "\n").encode())
    path = tmp_path / "data.jsonl.gz"
    path.write_bytes(data[:math.floor(len(data) * keep)] if keep < 1 else data)
    nonblank = _nonblank(_lines(rows))
    _check(read, path, nonblank)

  check()


def test_helpsteer_parquet_with_wrong_types_parses_or_names_row(tmp_path):
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq

  @FUZZ
  @given(st.lists(st.fixed_dictionaries({
      "prompt": st.one_of(st.none(), st.text(max_size=20)),
      "response": st.one_of(st.none(), st.text(max_size=20)),
      **{k: st.one_of(st.none(), st.integers(-3, 7)) for k in HELPSTEER_ATTRIBUTES}}),
      min_size=1, max_size=5))
  def check(rows):
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    _check(lambda p, mode, rep: readers.read_helpsteer(p, on_bad_record=mode, report=rep),
           path, len(rows))

  check()


_csv_cell = st.one_of(st.text(max_size=30), st.just("[1, 2.5]"), st.just("[nan]"),
                      st.just("[[[["), st.just("{[]}"), st.just("x" * 200_000),
                      st.just("[" + "1," * 50 + "]"))


def test_2d_csv_reader_parses_or_names_file_and_line(tmp_path):
  @FUZZ
  @given(st.lists(st.fixed_dictionaries({c: _csv_cell for c in pairs.CSV_COLUMNS}),
                  min_size=1, max_size=5), st.booleans())
  def check(rows, invalid_utf8):
    path = tmp_path / "data.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
      writer = csv.DictWriter(f, fieldnames=list(pairs.CSV_COLUMNS))
      writer.writeheader()
      writer.writerows(rows)
    if invalid_utf8:
      with open(path, "ab") as f:
        f.write(b"\xff\xfe,broken\n")
    _check(lambda p, mode, rep: pairs.read_2d(p, on_bad_record=mode, report=rep), path,
           len(rows) + invalid_utf8)

  check()


def test_control_character_line_is_a_counted_bad_record(tmp_path):
  """'\\x1f' is whitespace to str.strip but not to JSON: counted, never dropped."""
  path = tmp_path / "data.jsonl"
  path.write_text("\x1f\n  \n", encoding="utf-8")
  with pytest.raises(DataError, match=r"data\.jsonl:1"):
    readers.read_helpsteer(path, on_bad_record="error")
  report = BadRecordReport()
  assert readers.read_helpsteer(path, on_bad_record="skip", report=report) == []
  assert report.total == 1
