"""The `--config.data.on_bad_record=skip` hint appears only where it works: every prompt
reader of the online tasks (JSONL / text prompts, HelpSteer3 rows as GenRM or principle
judge prompts, SteerLM 2.0's) names a bad row's file and line and, with the flag, skips
and counts it; an unreadable file (which no flag can skip) gets no hint. The GenRM
prompts end to end: the hinted command runs and reports the row it skipped."""

import gzip
import json

import pytest
from test_genrm_rl import FEEDBACK, PREFERENCE
from test_principle_rl import _config as principle_config
from test_principle_rl import write_rows as write_principle_rows

from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.errors import DataError
from helpsteer_jax.inference import steering
from helpsteer_jax.models import hf
from helpsteer_jax.runs import prompts as prompts_lib
from helpsteer_jax.tasks import steerlm2

from cli_utils import run_main
from test_helpsteer3_data import write_rows
from train_utils import task_config

HINT = "--config.data.on_bad_record=skip"
NO_RESPONSE2 = {k: v for k, v in PREFERENCE[0].items() if k != "response2"}


def _jsonl(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return path


def _both_ways(read, where: str, kept: int):
  """`read(on_bad_record, report)`: a DataError naming `where` that the CLI may hint at,
  then with skip the good rows and one bad record counted."""
  with pytest.raises(DataError, match=where) as err:
    read("error", None)
  assert err.value.skippable
  report = BadRecordReport()
  assert len(read("skip", report)) == kept and report.total == 1


def _rl_config(**prompts):
  config = task_config("rl")
  config.prompts.update(prompts)
  return config


def _read(config):
  def read(mode, report):
    config.data.on_bad_record = mode
    return prompts_lib.read_requests(config.prompts.train_path, "train", {}, config, report)
  return read


def test_the_jsonl_prompt_reader_skips_a_bad_row(tmp_path):
  path = _jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Hi"}, {"prompt": "x",
                "attributes": {"verbosity": 9}}, "{not json", {"prompt": "Bye"}])
  config = _rl_config(train_path=str(path))
  with pytest.raises(DataError, match=r"prompts.jsonl:2: .*outside 0..4") as err:
    _read(config)("error", None)
  assert err.value.skippable
  report = BadRecordReport()
  assert [r.prompt for r in _read(config)("skip", report)] == ["Hi", "Bye"]
  assert report.total == 2 and "prompts.jsonl:3" in report.summary()


def test_the_text_and_stdin_prompt_readers_skip_a_bad_row(tmp_path):
  import io
  stdin = '{"prompt": "a"}\n{"prompt": "b", "attributes": {"wit": 1}}\n'
  read = (lambda mode, report: steering.read_requests(
      "-", {}, stdin=io.StringIO(stdin), on_bad_record=mode, report=report))
  _both_ways(read, r"<stdin>:2: .*wit", 1)


def test_the_genrm_prompt_reader_skips_a_row_without_response2(tmp_path):
  write_rows(tmp_path, "preference", [PREFERENCE[0], NO_RESPONSE2, PREFERENCE[1]])
  write_rows(tmp_path, "feedback", FEEDBACK)
  config = _rl_config(format="genrm", train_path=str(tmp_path))
  _both_ways(_read(config), r"preference/train.jsonl.gz:2: .*response2", 2)


def test_the_genrm_feedback_reader_skips_a_bad_row(tmp_path):
  write_rows(tmp_path, "preference", PREFERENCE[:2])
  write_rows(tmp_path, "feedback", [FEEDBACK[0], {**FEEDBACK[1], "feedback2": 3}])
  config = _rl_config(format="genrm", train_path=str(tmp_path))
  _both_ways(_read(config), r"feedback/train.jsonl.gz:2", 2)


def test_the_principle_prompt_reader_skips_a_bad_row(tmp_path):
  rows = write_principle_rows(tmp_path / "hs3" / "principle" / "train.jsonl.gz", n=3)
  bad = tmp_path / "bad" / "principle.jsonl"
  _jsonl(bad, [rows[0], {**rows[1], "fulfilment": "Maybe"}, rows[2]])
  config = principle_config(tmp_path / "hs3")
  config.prompts.train_path = str(bad)
  _both_ways(_read(config), r"principle.jsonl:2: .*fulfilment", 2)


def test_the_rl_prompts_are_read_with_the_flag(tmp_path):
  """`read_prompts` (RL's, iterative DPO's rounds') passes the flag and the report."""
  path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "Hi"}, {"text": "no prompt"}])
  config = _rl_config(train_path=str(path))
  config.data.on_bad_record = "skip"
  report = BadRecordReport()
  tokenizer = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path / "tok"))
  kept = prompts_lib.read_prompts(config, {}, tokenizer, False, 1000, "train", report=report)
  assert [p.request.prompt for p in kept] == ["Hi"] and report.total == 1


@pytest.mark.parametrize("attributes", ["run", "labels"])
def test_steerlm2_prompt_readers_skip_a_bad_row(tmp_path, attributes):
  rows = [{"prompt": "Hi", "response": "Hello", **dict.fromkeys(
      ("helpfulness", "correctness", "coherence", "complexity", "verbosity"), 3)}] * 2
  path = _jsonl(tmp_path / "rows.jsonl", [rows[0], {"response": "no prompt"}, rows[1]])
  config = task_config("steerlm2")
  config.prompts.update(train_path=str(path), attributes=attributes)

  def read(mode, report):
    config.data.on_bad_record = mode
    return steerlm2.read_requests(config, ("helpfulness",), {"helpfulness": 4}, report=report)
  _both_ways(read, r"rows.jsonl:2", 2)


def test_an_unreadable_file_gets_no_hint(tmp_path):
  """A cut-off gzip file cannot be skipped a row at a time: the error says what to do and
  offers no flag; a bad row of the same reader does."""
  good = tmp_path / "good" / "bench.jsonl"
  _jsonl(good, [{"id": 1, "prompt": "p", "chosen": ["a"] * 3, "rejected": ["b"] * 3,
                 "domain": "chat"}, {"id": 2, "prompt": "p", "chosen": ["a"],
                                     "rejected": ["b"] * 3, "domain": "chat"}])
  cut = tmp_path / "cut" / "bench.jsonl.gz"
  cut.parent.mkdir()
  cut.write_bytes(gzip.compress(good.read_bytes())[:-12])
  for path, hinted in ((good, True), (cut, False)):
    proc = run_main("--config=configs/evaluate_rm.py", f"--config.data.rm_bench_path={path}",
                    f"--workdir={tmp_path / 'run'}", devices=1, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert str(path) in proc.stderr and (HINT in proc.stderr) == hinted, proc.stderr[-2000:]


def test_the_genrm_reader_hint_works_end_to_end(tmp_path):
  """rl:genrm on HelpSteer3 rows, one preference row without `response2`: the error names
  its file and line and hints at the flag; the hinted command runs, skips that row and
  reports it at the end (summary.json's `bad_records`, the closing lines)."""
  data = tmp_path / "hs3"
  write_rows(data, "preference", [PREFERENCE[0], NO_RESPONSE2, PREFERENCE[1]])
  write_rows(data, "feedback", FEEDBACK)
  write_rows(data, "preference", PREFERENCE[:2], "validation")
  tok = demo_tokenizer.build_demo_tokenizer(tmp_path / "tok")
  args = ("--config=configs/rl.py:genrm", "--config.init.source=", f"--config.tokenizer={tok}",
          "--config.model.hidden_size=64", "--config.model.intermediate_size=128",
          "--config.model.num_layers=2", f"--config.prompts.train_path={data}",
          "--config.train.num_steps=1", "--config.rollout.prompts_per_iteration=2",
          "--config.rollout.max_new_tokens=8", "--config.train.global_batch=8",
          "--config.train.micro_batch=8", "--config.train.seq_len=448",
          "--config.train.export_hf=false", f"--workdir={tmp_path / 'run'}")
  proc = run_main(*args, devices=1, check=False)
  assert proc.returncode == 2
  assert "preference/train.jsonl.gz:2" in proc.stderr and HINT in proc.stderr
  proc = run_main(*args, HINT, devices=1)
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["bad_records"] == 1 and summary["status"] == "finished"
  assert "1 bad record(s) skipped" in proc.stdout and "train.jsonl.gz:2" in proc.stdout
