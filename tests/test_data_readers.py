"""Readers: HelpSteer rows and SteerLM conversations from every source, bad rows, TFDS."""

import dataclasses
import gzip
import json
import logging
import sys
import types

import pytest

from helpsteer_jax.data.demo import rows as demo
from helpsteer_jax.data.formats.helpsteer import (
  read_helpsteer,
  read_records,
  read_steerlm_conversations,
)
from helpsteer_jax.data.formats.rows import BadRecordReport, iter_json_lines
from helpsteer_jax.data.formats.task_source import load_conversations
from helpsteer_jax.data.records import HELPSTEER_ATTRIBUTES, Conversation, Turn
from helpsteer_jax.data.template import (
  DEFAULT_SYSTEM,
  generation_prompt,
  parse_label_string,
  regression_text,
  sft_pieces,
)
from helpsteer_jax.errors import ConfigError, DataError

SCORES = dict(helpfulness=3, correctness=4, coherence=4, complexity=1, verbosity=2)


def row(**kw):
  return {"prompt": "What is 2 plus 2?", "response": "It is 4.", **SCORES, **kw}


def write_jsonl(path, rows):
  """Rows are dicts (dumped) or raw strings (written as they are)."""
  text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
  opener = gzip.open if str(path).endswith(".gz") else open
  with opener(path, "wt", encoding="utf-8") as f:
    f.write(text)
  return path


def write_parquet(path, rows):
  import pyarrow as pa
  import pyarrow.parquet as pq
  pq.write_table(pa.Table.from_pylist(rows), path)
  return path


def no_source(convs):
  return [dataclasses.replace(c, source="") for c in convs]


# ------------------------------------------------------------------ sources


def test_jsonl_gz_parquet_and_directory_give_identical_conversations(tmp_path):
  rows = demo.demo_rows(40, seed=3)
  assert any("<extra_id_1>" in r["prompt"] for r in rows)
  (tmp_path / "d").mkdir()
  sources = [write_jsonl(tmp_path / "a.jsonl", rows), write_jsonl(tmp_path / "a.jsonl.gz", rows),
             write_parquet(tmp_path / "a.parquet", rows),
             write_jsonl(tmp_path / "d" / "validation.jsonl.gz", rows)]
  results = [read_helpsteer(s) for s in sources[:3]]
  results.append(read_helpsteer(tmp_path / "d", split="validation"))
  results.append(read_records(str(tmp_path / "d"), split="validation"))
  assert len(results[0]) == 40
  for convs in results[1:]:
    assert no_source(convs) == no_source(results[0])
  assert results[0][4].source == f"{sources[0]}:5"
  assert results[3][4].source == f"{sources[3]}:5"


def test_demo_dataset_directory_as_the_hub_ships_it(tmp_path):
  demo.write_demo_dataset(tmp_path, num_train=30, num_validation=7)
  assert len(read_helpsteer(tmp_path)) == 30
  val = read_helpsteer(tmp_path, split="validation")
  assert len(val) == 7 and all(c.system == DEFAULT_SYSTEM for c in val)


def test_directory_prefers_jsonl_gz_and_names_what_is_missing(tmp_path):
  write_jsonl(tmp_path / "train.jsonl.gz", [row()])
  write_jsonl(tmp_path / "train.jsonl", [row(), row()])
  assert len(read_helpsteer(tmp_path)) == 1
  with pytest.raises(ConfigError, match=r"validation\.jsonl\.gz.*train\.jsonl"):
    read_helpsteer(tmp_path, split="validation")


@pytest.mark.parametrize("name", ["missing.jsonl", "./data/helpsteer"])
def test_missing_local_path_is_a_config_error(tmp_path, name, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ConfigError, match="does not exist"):
    read_helpsteer(name)


def test_unsupported_extension(tmp_path):
  (tmp_path / "rows.csv").write_text("prompt,response\n")
  with pytest.raises(ConfigError, match="unsupported file type"):
    read_helpsteer(tmp_path / "rows.csv")


def test_hub_id_is_loaded_with_datasets(monkeypatch):
  calls = []

  def load_dataset(repo_id, split):
    calls.append((repo_id, split))
    return [row(), row(response=" "), row(prompt="Second?")]

  monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
  report = BadRecordReport()
  convs = read_helpsteer("nvidia/HelpSteer2", split="validation", on_bad_record="skip",
                         report=report)
  assert calls == [("nvidia/HelpSteer2", "validation")]
  assert [c.turns[0].text for c in convs] == ["What is 2 plus 2?", "Second?"]
  assert convs[1].source == "nvidia/HelpSteer2 [validation]:3"
  assert report.counts == {"empty response": 1}
  with pytest.raises(DataError, match=r"nvidia/HelpSteer2 \[validation\]:2: row 2: empty response"):
    read_helpsteer("nvidia/HelpSteer2", split="validation")


def test_hub_failure_is_a_clear_error(monkeypatch):
  def load_dataset(repo_id, split):
    raise ConnectionError("no network")

  monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
  with pytest.raises(ConfigError, match="not a local path.*ConnectionError: no network.*directory"):
    read_helpsteer("nvidia/HelpSteer2")
  monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
  with pytest.raises(ConfigError, match="needs the `datasets` package"):
    read_helpsteer("nvidia/HelpSteer2")


# ------------------------------------------------------------------ HelpSteer rows


def test_multi_turn_prompt_is_split(tmp_path):
  prompt = ("Hi\n<extra_id_1>Assistant\nHello!\n<extra_id_1>User\nName a fruit.\n"
            "<extra_id_1>Assistant\nApple.\n<extra_id_1>User\nAnother?")
  [conv] = read_helpsteer(write_jsonl(tmp_path / "t.jsonl", [row(prompt=prompt, response="Pear.")]))
  assert conv.turns == (
      Turn("User", "Hi"), Turn("Assistant", "Hello!", trainable=False),
      Turn("User", "Name a fruit."),
      Turn("Assistant", "Apple.", trainable=False), Turn("User", "Another?"),
      Turn("Assistant", "Pear.",
           "helpfulness:3,correctness:4,coherence:4,complexity:1,verbosity:2"))
  assert conv.attributes == SCORES and conv.mask_role == "User" and conv.system == DEFAULT_SYSTEM


BAD_HELPSTEER = [
    ('{"prompt": "x", "response": ', "malformed JSON"),
    ("[1, 2, 3]", "not a JSON object"),
    (row(response=None), "missing field 'response'"),
    ({k: v for k, v in row().items() if k != "prompt"}, "missing field 'prompt'"),
    ({k: v for k, v in row().items() if k != "verbosity"}, "missing field 'verbosity'"),
    (row(helpfulness=5), "score outside 0..4"),
    (row(coherence=-1), "score outside 0..4"),
    (row(helpfulness=3.0), "score not an integer"),
    (row(helpfulness=True), "score not an integer"),
    (row(correctness="4"), "score not an integer"),
    (row(prompt=""), "empty prompt"),
    (row(response=" \n\t"), "empty response"),
    (row(prompt=["a", "b"]), "wrong type for 'prompt'"),
    (row(response=7), "wrong type for 'response'"),
]


@pytest.mark.parametrize("bad, reason", BAD_HELPSTEER)
def test_bad_helpsteer_row_error_mode_names_file_and_line(tmp_path, bad, reason):
  path = write_jsonl(tmp_path / "rows.jsonl", [row(), row(), bad, row()])
  with pytest.raises(DataError, match=rf"rows\.jsonl:3: {reason}") as info:
    read_helpsteer(path)
  assert info.value.path == str(path) and info.value.line == 3


@pytest.mark.parametrize("bad, reason", BAD_HELPSTEER)
def test_bad_helpsteer_row_skip_mode_counts_it(tmp_path, bad, reason):
  rows = [row(response="one"), bad, row(response="two"), bad, row(response="three")]
  report = BadRecordReport()
  convs = read_helpsteer(write_jsonl(tmp_path / "rows.jsonl.gz", rows), on_bad_record="skip",
                         report=report)
  assert [c.turns[-1].text for c in convs] == ["one", "two", "three"]
  assert [c.source.rsplit(":", 1)[1] for c in convs] == ["1", "3", "5"]
  assert report.counts == {reason: 2} and report.total == 2
  assert "rows.jsonl.gz:2" in report.summary() and "rows.jsonl.gz:4" in report.summary()


def test_skip_mode_counts_each_reason_and_warns(tmp_path, caplog):
  rows = [row(), "not json", row(helpfulness=9), row(prompt=" "), row(helpfulness=7), row()]
  path = write_jsonl(tmp_path / "mixed.jsonl", rows)
  report = BadRecordReport()
  with caplog.at_level(logging.WARNING):
    convs = read_helpsteer(path, on_bad_record="skip", report=report)
  assert len(convs) == 2
  assert report.counts == {"malformed JSON": 1, "score outside 0..4": 2, "empty prompt": 1}
  assert report.examples["score outside 0..4"] == [f"{path}:3 (helpfulness=9)",
                                                   f"{path}:5 (helpfulness=7)"]
  assert "4 bad record(s) skipped" in caplog.text and "mixed.jsonl:2" in caplog.text
  # Without a report the warning is the record: nothing is dropped silently.
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    read_helpsteer(path, on_bad_record="skip")
  assert "4 bad record(s) skipped" in caplog.text


def test_reports_merge():
  a, b = BadRecordReport(), BadRecordReport()
  a.add("x.jsonl", 1, "empty prompt")
  b.add("y.jsonl", 2, "empty prompt", "detail")
  b.add("y.jsonl", 3, "malformed JSON")
  both = a + b
  assert both.counts == {"empty prompt": 2, "malformed JSON": 1} and both.total == 3
  assert both.examples["empty prompt"] == ["x.jsonl:1", "y.jsonl:2 (detail)"]
  assert a.total == 1  # + leaves its operands alone
  a.merge(b)
  assert a.counts == both.counts
  assert BadRecordReport().summary() == "no bad records"


def test_parquet_bad_row_says_row(tmp_path):
  path = write_parquet(tmp_path / "rows.parquet", [row(), row(helpfulness=6)])
  with pytest.raises(DataError, match=r"rows\.parquet:2: row 2: score outside 0\.\.4"):
    read_helpsteer(path)
  report = BadRecordReport()
  assert len(read_helpsteer(path, on_bad_record="skip", report=report)) == 1
  assert "row 2" in report.summary()


def test_unknown_modes_and_formats_are_config_errors(tmp_path):
  path = write_jsonl(tmp_path / "rows.jsonl", [row()])
  with pytest.raises(ConfigError, match="on_bad_record"):
    read_helpsteer(path, on_bad_record="ignore")
  with pytest.raises(ConfigError, match="data format"):
    read_records(path, fmt="csv")


def test_truncated_gzip_is_a_data_error_naming_the_file(tmp_path):
  path = write_jsonl(tmp_path / "train.jsonl.gz", demo.demo_rows(200, seed=0))
  data = path.read_bytes()
  path.write_bytes(data[: len(data) // 2])
  for mode in ("error", "skip"):
    with pytest.raises(DataError, match=r"train\.jsonl\.gz: truncated or corrupt gzip"):
      read_helpsteer(path, on_bad_record=mode)
  (tmp_path / "plain.jsonl.gz").write_text('{"prompt": "not gzip"}\n')
  with pytest.raises(DataError, match=r"plain\.jsonl\.gz: truncated or corrupt gzip"):
    read_helpsteer(tmp_path / "plain.jsonl.gz")


def test_iter_json_lines_numbers_lines_from_one(tmp_path):
  path = tmp_path / "x.jsonl"
  path.write_bytes(b'{"a": 1}\n\n{"a": 2}\n\xff\xfe\n"str"\n')
  items = list(iter_json_lines(path))
  assert [line for line, _ in items] == [1, 3, 4, 5]
  assert items[0][1] == {"a": 1} and items[1][1] == {"a": 2}
  assert isinstance(items[2][1], ValueError) and isinstance(items[3][1], TypeError)


def test_real_helpsteer2_rows_load_and_template(helpsteer2_sample):
  convs = read_helpsteer(helpsteer2_sample)
  assert len(convs) == 100
  for conv in convs:
    label = conv.turns[-1].label
    assert list(parse_label_string(label)) == list(HELPSTEER_ATTRIBUTES)
    assert parse_label_string(label) == conv.attributes
    pieces = sft_pieces(conv)
    assert "".join(p.text for p in pieces if p.loss) == conv.turns[-1].text + "\n<extra_id_1>"
    assert regression_text(conv).endswith(conv.turns[-1].text + "\n<extra_id_2>")
    assert generation_prompt(conv, conv.attributes).endswith(f"<extra_id_2>{label}\n")
  assert convs[0].source == f"{helpsteer2_sample}:1"
  assert convs[0].turns[0] == Turn("User", "c#")


# ------------------------------------------------------------------ SteerLM conversations


def steerlm(**kw):
  return {"system": "Be helpful.", "conversations": [
      {"from": "User", "value": "Hi", "label": None},
      {"from": "Assistant", "value": "Hello!", "label": "verbosity:1,helpfulness:4"},
      {"from": "User", "value": "Bye"},
      {"from": "Assistant", "value": "Goodbye!", "label": "quality:4,helpfulness:2"}],
      "mask": "User", "type": "VALUE_TO_TEXT", **kw}


def test_steerlm_conversations_keep_labels_as_given(tmp_path):
  unlabeled = steerlm(conversations=[{"from": "User", "value": "Hi", "label": None},
                                     {"from": "Assistant", "value": "Hello!"}])
  path = write_jsonl(tmp_path / "s.jsonl", [steerlm(), unlabeled])
  first, second = read_steerlm_conversations(path)
  assert first == Conversation(
      system="Be helpful.", turns=(
          Turn("User", "Hi"), Turn("Assistant", "Hello!", "verbosity:1,helpfulness:4"),
          Turn("User", "Bye"), Turn("Assistant", "Goodbye!", "quality:4,helpfulness:2")),
      mask_role="User", attributes={"quality": 4, "helpfulness": 2}, source=f"{path}:1")
  assert second.turns[1] == Turn("Assistant", "Hello!", None) and second.attributes is None
  assert read_records(path) == [first, second]  # sniffed


BAD_STEERLM = [
    ({"system": "s", "mask": "User"}, "missing field 'conversations'"),
    (steerlm(conversations=[]), "empty conversations"),
    (steerlm(conversations="Hi"), "wrong type for 'conversations'"),
    ({k: v for k, v in steerlm().items() if k != "system"}, "missing field 'system'"),
    (steerlm(conversations=[{"value": "Hi"}]), "turn without 'from'"),
    (steerlm(conversations=[{"from": "User"}]), "turn without 'value'"),
    (steerlm(conversations=[{"from": "Human", "value": "Hi"}]), "unknown role"),
    (steerlm(conversations=[{"from": "User", "value": " "}]), "empty value"),
    (steerlm(conversations=[{"from": "User", "value": "Hi"},
                            {"from": "Assistant", "value": "Yo", "label": "helpfulness=4"}]),
     "invalid label"),
    (steerlm(conversations=[{"from": "User", "value": "Hi"},
                            {"from": "Assistant", "value": "Yo", "label": "helpfulness:7"}]),
     "invalid label"),
    (steerlm(conversations=[{"from": "Assistant", "value": "Yo", "label": 4}]),
     "wrong type for 'label'"),
    (steerlm(mask="Bot"), "invalid mask"),
    (steerlm(type="TEXT_TO_VALUE"), "unsupported type"),
]


@pytest.mark.parametrize("bad, reason", BAD_STEERLM)
def test_bad_steerlm_rows(tmp_path, bad, reason):
  path = write_jsonl(tmp_path / "s.jsonl", [steerlm(), bad, steerlm()])
  with pytest.raises(DataError, match=rf"s\.jsonl:2: {reason}"):
    read_steerlm_conversations(path)
  report = BadRecordReport()
  convs = read_steerlm_conversations(path, on_bad_record="skip", report=report)
  assert [c.source for c in convs] == [f"{path}:1", f"{path}:3"]
  assert report.counts == {reason: 1}


def test_auto_format_sniffs_the_first_valid_row(tmp_path):
  path = write_jsonl(tmp_path / "s.jsonl", ["{broken", [1], steerlm()])
  report = BadRecordReport()
  convs = read_records(path, on_bad_record="skip", report=report)
  assert len(convs) == 1 and convs[0].system == "Be helpful."
  assert report.counts == {"malformed JSON": 1, "not a JSON object": 1}
  helpsteer = write_jsonl(tmp_path / "h.jsonl", [row()])
  assert read_records(helpsteer)[0].attributes == SCORES


# ------------------------------------------------------------------ TFDS


def test_tfds_builds_and_reads_back_without_tensorflow(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  pytest.importorskip("array_record")
  from helpsteer_jax.data.formats import tfds_helpsteer2
  src = demo.write_demo_dataset(tmp_path / "src", num_train=25, num_validation=6)
  builder = tfds_helpsteer2.build_tfds_helpsteer2(src, tmp_path / "tfds")
  assert "tensorflow" not in sys.modules
  files = sorted(p.name for p in (tmp_path / "tfds" / "helpsteer2" / "1.0.0").iterdir())
  assert "helpsteer2-train.array_record-00000-of-00001" in files
  assert builder.info.splits["train"].num_examples == 25
  for split in ("train", "validation"):
    back = tfds_helpsteer2.read_tfds_helpsteer2(tmp_path / "tfds", split)
    assert no_source(back) == no_source(read_helpsteer(src, split))
  assert back[0].source.endswith("[validation]:1")
  with pytest.raises(ConfigError, match="no built helpsteer2"):
    tfds_helpsteer2.read_tfds_helpsteer2(tmp_path / "elsewhere", "train")


def test_tfds_is_a_data_format_of_the_tasks(tmp_path):
  """data.format="tfds" builds the array_record dataset once, then reads it."""
  pytest.importorskip("tensorflow_datasets")
  from helpsteer_jax import config_base
  src = demo.write_demo_dataset(tmp_path / "src", num_train=12, num_validation=4)
  config = config_base.base_config("acsft")
  config.data = config_base.data_config(format="tfds", tfds_source_dir=str(src))
  built = load_conversations(str(tmp_path / "tfds"), "train", config)
  assert no_source(built) == no_source(read_helpsteer(src, "train"))
  config.data.tfds_source_dir = ""
  again = load_conversations(str(tmp_path / "tfds"), "validation", config)
  assert no_source(again) == no_source(read_helpsteer(src, "validation"))


def test_tfds_builder_refuses_bad_rows(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  from helpsteer_jax.data.formats import tfds_helpsteer2
  src = tmp_path / "src"
  src.mkdir()
  write_jsonl(src / "train.jsonl.gz", [row(), row(helpfulness=8)])
  write_jsonl(src / "validation.jsonl.gz", [row()])
  with pytest.raises(DataError, match=r"train\.jsonl\.gz:2: score outside"):
    tfds_helpsteer2.build_tfds_helpsteer2(src, tmp_path / "tfds")
  builder = tfds_helpsteer2.build_tfds_helpsteer2(src, tmp_path / "tfds2", on_bad_record="skip")
  assert builder.bad_records.counts == {"score outside 0..4": 1}
  assert len(tfds_helpsteer2.read_tfds_helpsteer2(tmp_path / "tfds2", "train")) == 1
