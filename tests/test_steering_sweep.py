"""Steering sweeps: settings and measures, the task end to end on a tiny model with an
attribute model's predictions, resume after a kill, reports and bad input.

The policy is a tiny random model exported with a `steerlm` section (complexity and
verbosity steerable), the attribute model a tiny random HF reward directory: cheap,
and every number the reports give is recomputed here from the generations file.
"""

import json
import runpy
import shutil
import struct

import numpy as np
import pytest

from helpsteer_jax import runtime
from helpsteer_jax.data import chat_template, segment
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError, DataError
from helpsteer_jax.eval import steering_sweep as sweep_lib
from helpsteer_jax.eval import sweep_report
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.engine import Output
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.models import builder, catalog, hf, reward, reward_hf
from helpsteer_jax.scoring.load import load_scorer
from helpsteer_jax.tasks import generate
from helpsteer_jax.tasks import steering_sweep as task

from cli_utils import run_main
from conftest import REPO_ROOT

SHAPE = dict(hidden_size=64, intermediate_size=176, num_layers=2, num_heads=4, num_kv_heads=2,
             initializer_range=0.1)
SPEC = chat_template.SteerSpec(("complexity", "verbosity"), {"complexity": 1, "verbosity": 2})
PROMPTS = [{"prompt": "What is 2 plus 3?", "id": "a"}, {"prompt": "Name two fruits.", "id": "b"},
           {"prompt": "What is the capital of Peru?", "id": "c", "attributes": {"complexity": 3}}]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """(policy HF dir with a steerlm section, attribute-model HF dir, prompt file)."""
  root = tmp_path_factory.mktemp("sweep_models")
  tok = demo_tokenizer.build_demo_tokenizer(root / "tok")
  policy = root / "policy"
  hf.save_hf_model(builder.create(catalog.model_config("tiny", **SHAPE), seed=0), policy,
                   dtype="float32", tokenizer=str(tok))
  chat_template.export_files(SPEC, policy)
  rm = reward.reward_model(catalog.model_config("tiny", **SHAPE), seed=1)
  rm.head.kernel[...] = np.random.RandomState(0).normal(
      size=rm.head.kernel[...].shape).astype(np.float32)
  reward_hf.save_reward_hf(rm, root / "rm", dtype="float32", tokenizer=str(tok))
  prompts = root / "prompts.jsonl"
  prompts.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
  return policy, root / "rm", prompts


def sweep_config(policy, prompts, **overrides):
  config = runpy.run_path(str(REPO_ROOT / "configs" / "steering_sweep.py"))["get_config"]()
  config.init.source, config.input = str(policy), str(prompts)
  config.max_new_tokens, config.batch_size = 8, 4
  config.mesh.update(data=2, fsdp=2, tensor=2)
  config.sweep.scores = "0,2,4"
  for key, value in overrides.items():
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = value
  return config


@pytest.fixture(scope="module")
def swept(models, tmp_path_factory):
  policy, rm, prompts = models
  workdir = tmp_path_factory.mktemp("sweep")
  result = task.run(sweep_config(policy, prompts, **{"scorer.source": str(rm)}), str(workdir))
  return workdir, result


def _rows(workdir):
  return [json.loads(line) for line in (workdir / task.GENERATIONS_FILE).read_text().splitlines()]


def test_every_setting_asks_the_swept_value_with_the_others_at_the_defaults(swept):
  workdir, result = swept
  rows = _rows(workdir)
  assert result["settings"] == 6 and result["prompts"] == 3 and len(rows) == 18
  assert result["distinct_inputs"] == 18  # no two settings share a label here
  for k, row in enumerate(rows):
    name, value = ("complexity", "verbosity")[k // 9], (0, 2, 4)[k // 3 % 3]
    assert (row["sweep_attribute"], row["sweep_value"], row["prompt_index"]) == (name, value,
                                                                                 k % 3)
    assert row["id"] == PROMPTS[k % 3]["id"]
    # The export's defaults, the prompt file's own value, then the swept one.
    own = PROMPTS[k % 3].get("attributes", {})
    assert row["attributes"] == {**SPEC.defaults, **own, name: value}
    assert row["finish_reason"] in ("stop", "length") and 1 <= row["tokens"] <= 8
    assert set(row["predicted"]) == set(ATTRIBUTES)


def test_reports_are_computed_from_the_generations_file(swept, models):
  workdir, _ = swept
  rows = _rows(workdir)
  summary = json.loads((workdir / "sweep.json").read_text())
  assert summary["attributes"] == ["complexity", "verbosity"] and summary["values"] == [0, 2, 4]
  assert summary["defaults"] == SPEC.defaults and summary["prompts"] == 3
  for name, entries in summary["sweeps"].items():
    assert [e["value"] for e in entries] == [0, 2, 4]
    for e in entries:
      mine = [r for r in rows if (r["sweep_attribute"], r["sweep_value"]) == (name, e["value"])]
      assert e["responses"] == len(mine) == 3
      assert e["mean_words"] == pytest.approx(np.mean([len(r["response"].split()) for r in mine]))
      assert e["mean_sentences"] == pytest.approx(np.mean(
          [sum(1 for s in segment.segment_texts(r["response"]) if s.strip()) for r in mine]))
      assert e["mean_tokens"] == pytest.approx(np.mean([r["tokens"] for r in mine]))
      assert e["length_share"] == pytest.approx(np.mean([r["finish_reason"] == "length"
                                                         for r in mine]))
      for attr in ATTRIBUTES:
        assert e["predicted"][attr] == pytest.approx(np.mean([r["predicted"][attr]
                                                              for r in mine]))
      assert e["unscored"] == 0
  # The predictions are the attribute model's for the prompt and its response.
  rm = models[1]
  config = sweep_config(*models[::2])
  config.scorer.source = str(rm)
  scorer = load_scorer(config.scorer, runtime.setup(config))
  first = rows[4]
  request = steering.make_request(first["prompt"], first["attributes"])
  direct = scorer([request.answered(first["response"])])[0]
  np.testing.assert_allclose([first["predicted"][a] for a in ATTRIBUTES], direct, atol=1e-3)
  assert len({json.dumps(r["predicted"]) for r in rows}) > 1

  table = (workdir / "sweep.md").read_text()
  assert table.count("\n| complexity |") == 3 and table.count("\n| verbosity |") == 3
  png = (workdir / "sweep.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n"
  width, height = struct.unpack(">II", png[16:24])
  assert (width, height) == (2 * 340, 320)  # one 3.4 x 3.2 inch panel per attribute
  assert sweep_report.plot(summary, workdir / "again.png") == ["complexity", "verbosity"]


def test_a_killed_sweep_resumes_to_the_same_result(swept, models, tmp_path):
  workdir, _ = swept
  policy, rm, prompts = models
  lines = (workdir / task.GENERATIONS_FILE).read_text().splitlines(keepends=True)
  (tmp_path / task.GENERATIONS_FILE).write_text("".join(lines[:6]) + lines[6][:30])
  result = task.run(sweep_config(policy, prompts, **{"scorer.source": str(rm)}), str(tmp_path))
  assert result["already_written"] == 6
  assert ((tmp_path / task.GENERATIONS_FILE).read_bytes()
          == (workdir / task.GENERATIONS_FILE).read_bytes())
  assert (tmp_path / "sweep.json").read_text() == (workdir / "sweep.json").read_text()
  # A file of another sweep is refused, not extended.
  shutil.copy(workdir / task.GENERATIONS_FILE, tmp_path / task.GENERATIONS_FILE)
  with pytest.raises(ConfigError, match="another input"):
    task.run(sweep_config(policy, prompts, **{"scorer.source": str(rm), "sweep.scores": "1,3"}),
             str(tmp_path))


def test_summary_means_and_settings_on_known_rows():
  grid = sweep_lib.settings({"helpfulness": 4, "verbosity": 2}, ["verbosity"], (0, 4))
  assert [dict(s.attributes) for s in grid] == [{"helpfulness": 4, "verbosity": 0},
                                                {"helpfulness": 4, "verbosity": 4}]
  rows = [
      {"sweep_attribute": "verbosity", "sweep_value": 0, "response": "Yes.", "tokens": 3,
       "finish_reason": "stop"},
      {"sweep_attribute": "verbosity", "sweep_value": 0, "response": "Sure. Not at all!",
       "tokens": 6, "finish_reason": "length"},
      {"sweep_attribute": "verbosity", "sweep_value": 4, "response": "One two.\nThree, e.g. 2.5",
       "tokens": 9, "finish_reason": "stop"}]
  low, high = sweep_lib.summarize(rows, grid)["sweeps"]["verbosity"]
  assert (low["mean_words"], low["mean_sentences"], low["mean_tokens"]) == (2.5, 1.5, 4.5)
  assert low["length_share"] == 0.5 and low["predicted"] is None
  assert (high["mean_words"], high["mean_sentences"]) == (5.0, 2.0)
  with pytest.raises(ConfigError, match="no generations for verbosity=4"):
    sweep_lib.summarize(rows[:2], grid)


class CountingGenerator:
  """A generator that records the model inputs it is given; its answer names the input."""

  def __init__(self):
    self.inputs = []

  def complete(self, texts, max_new_tokens, sampling=None, seed=0):
    self.inputs += texts
    return [Output([7, 8], [0.0, 0.0], f"answer {len(self.inputs) - len(texts) + k} (seed {seed})",
                   "stop", None) for k in range(len(texts))]


def test_a_label_two_sweeps_share_is_generated_once_and_resumes(tmp_path):
  defaults = {"complexity": 2, "verbosity": 4}
  # complexity 2 and 4 at verbosity 4, then verbosity 2 and 4 at complexity 2: the last
  # setting is the first's label.
  grid = sweep_lib.settings(defaults, ["complexity", "verbosity"], (2, 4))
  prompts = [steering.make_request(p, defaults) for p in ("Hi there.", "Name a fruit.")]
  requests = sweep_lib.sweep_requests(prompts, grid)
  assert sweep_lib.same_input_sources(requests) == [0, 1, 2, 3, 4, 5, 0, 1]
  path = tmp_path / "rows.jsonl"
  kw = dict(batch_size=3, max_new_tokens=4, sampling=SamplingConfig(), seed=0)
  generator = CountingGenerator()
  assert sweep_lib.generate_rows(generator, requests, path, **kw) == 0
  assert len(generator.inputs) == 6 == len(set(generator.inputs))
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  assert len(rows) == 8
  for copy, source in ((6, 0), (7, 1)):
    assert steering.Request.matches(rows[copy], requests[copy])
    assert (rows[copy]["sweep_attribute"], rows[copy]["sweep_value"]) == ("verbosity", 4)
    for key in ("response", "tokens", "finish_reason", "attributes", "prompt"):
      assert rows[copy][key] == rows[source][key]
  summary = sweep_lib.summarize(rows, grid)
  assert [e["responses"] for e in summary["sweeps"]["verbosity"]] == [2, 2]
  # Killed with the copies' batch unwritten: they are read back from the file, and nothing
  # is generated again.
  full = path.read_bytes()
  path.write_bytes(b"".join(full.splitlines(keepends=True)[:6]) + b'{"prompt": "Hi')
  again = CountingGenerator()
  assert sweep_lib.generate_rows(again, requests, path, **kw) == 6
  assert again.inputs == [] and path.read_bytes() == full


def test_prompts_from_mt_bench_first_turns(tmp_path, models):
  questions = tmp_path / "question.jsonl"
  questions.write_text("".join(json.dumps(r) + "\n" for r in [
      {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
      {"question_id": 82, "category": "math", "turns": ["What is 3 times 4?", "And 5?"]}]))
  config = sweep_config(models[0], "", **{"mt_bench.questions": str(questions),
                                          "prompt_limit": 1})
  prompts, source = task.read_prompts(config, {"verbosity": 1})
  assert [(p.prompt, p.extra) for p in prompts] == [
      ("Write a poem.", {"question_id": 81, "category": "writing"})]
  assert prompts[0].attributes == {"verbosity": 1} and str(questions) in source


@pytest.mark.parametrize("overrides,error,message", [
    ({"sweep.scores": "0,5"}, ConfigError, r"sweep.scores='0,5': 5 is outside 0\.\.4"),
    ({"sweep.scores": "0,high"}, ConfigError, "'high' is not an integer"),
    ({"sweep.attributes": "verbosity,wit"}, ConfigError, r"unknown attribute\(s\) \['wit'\]"),
    ({"steer.verbosity": 7}, ConfigError, "config.steer: .*verbosity.* outside 0..4"),
    ({"input": "BAD"}, DataError, r"bad\.jsonl:2: missing field 'prompt'"),
    ({"input": "", "mt_bench.questions": "QUESTIONS"}, DataError,
     r"question\.jsonl:2: 'turns' must be"),
    ({"mt_bench.questions": "QUESTIONS"}, ConfigError, "not both"),
])
def test_bad_input_fails_before_the_model_loads(models, tmp_path, monkeypatch, overrides, error,
                                                message):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "Hi"}\n{"text": "no prompt"}\n')
  questions = tmp_path / "question.jsonl"
  questions.write_text('{"question_id": 1, "category": "x", "turns": ["a"]}\n'
                       '{"question_id": 2, "category": "x", "turns": []}\n')
  paths = {"BAD": str(bad), "QUESTIONS": str(questions)}
  overrides = {k: paths.get(v, v) for k, v in overrides.items()}
  monkeypatch.setattr(generate, "build_generator", lambda *a: pytest.fail("model loaded"))
  with pytest.raises(error, match=message):
    task.run(sweep_config(models[0], models[2], **overrides), str(tmp_path / "w"))
  assert not (tmp_path / "w" / task.GENERATIONS_FILE).exists()


def test_a_malformed_prompt_row_is_one_line_naming_file_and_line(models, tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "Hi"}\n{"prompt": "x", "attributes": {"verbosity": 9}}\n')
  proc = run_main("--config=configs/steering_sweep.py", f"--workdir={tmp_path / 'w'}",
                  f"--config.init.source={models[0]}", f"--config.input={bad}", check=False)
  assert proc.returncode == 2
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert errors == [f"error: {bad}:2: score of 'verbosity' is 9, outside 0..4"]
  assert proc.stderr.rstrip().endswith(errors[0])


def test_adherence_is_the_mean_absolute_error_to_the_requested_values(tmp_path):
  """The sweep's per-attribute error (each value weighted by its scored responses), the
  held-out requests' error per requested attribute, and the side-by-side report."""
  from helpsteer_jax.eval import adherence

  def row(attribute, value, predicted, **requested):
    p = None if predicted is None else {n: 0.0 for n in ATTRIBUTES} | predicted
    return {"sweep_attribute": attribute, "sweep_value": value, "response": "a b.",
            "tokens": 2, "finish_reason": "stop", "predicted": p,
            "attributes": requested or {attribute: value}}
  grid = sweep_lib.settings({"verbosity": 2}, ["verbosity"], (0, 4))
  rows = [row("verbosity", 0, {"verbosity": 1.0}), row("verbosity", 0, {"verbosity": 0.5}),
          row("verbosity", 4, {"verbosity": 1.0}), row("verbosity", 4, None)]
  summary = sweep_lib.summarize(rows, grid)
  assert [e["abs_error"] for e in summary["sweeps"]["verbosity"]] == [0.75, 3.0]
  assert sweep_lib.adherence(summary) == {"verbosity": (1.0 + 0.5 + 3.0) / 3,
                                          "mean": (1.0 + 0.5 + 3.0) / 3}

  requested = [row("", 0, {"helpfulness": 3.5, "verbosity": 1.0}, helpfulness=4, verbosity=2),
               row("", 0, {"helpfulness": 1.0, "verbosity": 1.0}, helpfulness=2, verbosity=0),
               row("", 0, None, helpfulness=0, verbosity=0)]
  errors = adherence.errors(requested)
  assert errors == {"helpfulness": 0.75, "verbosity": 1.0, "mean": 0.875}
  text = adherence.table({"AC-SFT": errors, "iteration 1": {"helpfulness": 0.5, "mean": 0.5}})
  assert text.splitlines()[2] == "| AC-SFT | 0.750 | 1.000 | 0.875 |"
  assert text.splitlines()[3] == "| iteration 1 | 0.500 | - | 0.500 |"
  out = sweep_report.write_comparison({"a": summary, "b": summary}, tmp_path, "t")
  assert (tmp_path / "adherence.png").stat().st_size > 0 and "| b |" in out["table"]
