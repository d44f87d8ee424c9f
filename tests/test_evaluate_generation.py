"""configs/evaluate_generation.py: MT-Bench answered by a tiny model, judged offline.

The LLM judge is a stub OpenAI-compatible server on loopback that checks the
prompts it receives and answers with FastChat's `[[rating]]` format (the
reference: FastChat's `llm_judge` single-answer grading, whose prompts and
rating parsing the judge module reproduces); the attribute-model judge is
checked against scoring the same conversations directly.
"""

import json
import runpy
import shutil

import numpy as np
import pytest
from mt_bench_utils import JUDGE, PROMPTS, QUESTIONS, StubJudge, write_mt_bench

from helpsteer_jax import runtime
from helpsteer_jax.config_sections import DEMO_SHAPE, HELPSTEER2_WEIGHTS
from helpsteer_jax.data import template
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.errors import ConfigError, DataError, EvaluationError
from helpsteer_jax.eval import mt_bench_data, mt_bench_grading
from helpsteer_jax.eval.mt_bench_answers import conversation
from helpsteer_jax.models import catalog, reward_hf
from helpsteer_jax.models.reward import reward_model
from helpsteer_jax.runs import generation
from helpsteer_jax.scoring.load import load_scorer
from helpsteer_jax.scoring.rewards import weight_vector
from helpsteer_jax.tasks import evaluate_generation

from conftest import REPO_ROOT
from multiprocess import free_port

SHARED_MT_BENCH = REPO_ROOT.parent / "shared" / "data" / "mt_bench"


@pytest.fixture(scope="module")
def judge():
  stub = StubJudge()
  yield stub
  stub.stop()


@pytest.fixture(scope="module")
def models(served_models, tmp_path_factory):
  """The serve tests' policy and, beside it, an attribute model as an HF reward directory
  (the demo shape, a random head)."""
  root = tmp_path_factory.mktemp("models")
  (root / "policy").symlink_to(served_models / "policy")
  model = reward_model(catalog.model_config("tiny", **DEMO_SHAPE), seed=1)
  kernel = model.head.kernel
  kernel[...] = np.random.default_rng(0).normal(size=kernel[...].shape).astype(np.float32)
  reward_hf.save_reward_hf(model, root / "rm_hf", dtype="float32",
                           tokenizer=str(served_models / "tok"))
  return root


def eval_config(models, mt_dir, judge_url="", scorer="", **judge):
  config = runpy.run_path(str(REPO_ROOT / "configs" / "evaluate_generation.py"))["get_config"]()
  config.scorer.source = scorer
  config.init.source = str(models / "policy")
  config.mt_bench.dir = str(mt_dir)
  config.update(batch_size=2, max_new_tokens=12, max_length=512, model_id="tiny")
  config.judge.update(base_url=judge_url, model=JUDGE, max_retries=1, parallel=2, **judge)
  return config


def _rows(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def test_mt_bench_with_llm_judge_resumes_and_reports(models, judge, tmp_path):
  mt_dir = write_mt_bench(tmp_path / "mt")
  work = tmp_path / "run"
  config = eval_config(models, mt_dir, judge.url)
  with pytest.raises(evaluate_generation.JudgingIncomplete, match="1 judge requests failed"):
    evaluate_generation.run(config, str(work))

  answers = _rows(work / "answers.jsonl")
  assert [a["question_id"] for a in answers] == [81, 111, 91]
  assert all(len(a["choices"][0]["turns"]) == 2 for a in answers)
  assert answers[0]["attributes"] == {"quality": 4, "toxicity": 0, "humor": 0, "creativity": 0,
                                      "helpfulness": 4, "correctness": 4, "coherence": 4,
                                      "complexity": 4, "verbosity": 4}
  # The judge saw FastChat's prompts: the math question with its reference answers, the
  # second turn with the model's own first answer.
  prompts = {(s, u) for s, u in judge.requests}
  a111 = answers[1]["choices"][0]["turns"]
  want = PROMPTS["single-math-v1-multi-turn"].format(
      question_1=QUESTIONS[1]["turns"][0], question_2=QUESTIONS[1]["turns"][1], answer_1=a111[0],
      answer_2=a111[1], ref_answer_1="5", ref_answer_2="20")
  assert ("SYSTEM single-math-v1-multi-turn", want) in prompts
  a81 = answers[0]["choices"][0]["turns"]
  assert ("SYSTEM single-v1", PROMPTS["single-v1"].format(
      question=QUESTIONS[0]["turns"][0], answer=a81[0])) in prompts

  judged = _rows(work / "judgments.jsonl")
  assert [(j["question_id"], j["turn"]) for j in judged] == [(81, 1), (81, 2), (111, 1),
                                                            (111, 2), (91, 1)]
  scores = {(j["question_id"], j["turn"]): j["score"] for j in judged}
  assert scores[(111, 2)] == mt_bench_grading.UNPARSED  # counted as unparsed, never a 0
  table = json.loads((work / "mt_bench.json").read_text())["table"]
  assert table["overall"]["unparsed"] == 1 and table["overall"]["failed"] == 1
  parsed = [7, 6, 4, 9]
  assert table["overall"]["average"] == pytest.approx(np.mean(parsed))
  assert table["overall"]["turn_1"] == pytest.approx(np.mean([7, 4, 9]))
  assert table["categories"]["math"]["turn_2"] is None
  assert (work / "mt_bench.png").stat().st_size > 1000
  assert "| **overall** |" in (work / "mt_bench.md").read_text()

  # The judge is back: a rerun generates nothing and asks only the failed request.
  judge.broken = False
  asked = len(judge.requests)
  summary = evaluate_generation.run(config, str(work))
  assert summary["already_answered"] == 3 and summary["judge_requests"] == 1
  assert len(judge.requests) == asked + 1
  assert summary["table"]["overall"]["failed"] == 0
  assert summary["table"]["categories"]["roleplay"]["average"] == pytest.approx(8.5)
  assert _rows(work / "answers.jsonl") == answers

  # A run killed while writing its second row resumes to the same answers (greedy).
  text = (work / "answers.jsonl").read_text()
  lines = text.splitlines(keepends=True)
  (work / "answers.jsonl").write_text(lines[0] + lines[1][:40])
  config.judge.kind = "none"
  assert evaluate_generation.run(config, str(work))["already_answered"] == 1
  assert [{k: v for k, v in r.items() if k != "tstamp"} for r in _rows(work / "answers.jsonl")] \
      == [{k: v for k, v in r.items() if k != "tstamp"} for r in answers]

  # The second turn was generated from the model's own first answer.
  rt = runtime.setup(config)
  generator = generation.build_generator(config, rt, work, max_batch=2)
  questions = mt_bench_data.read_questions(mt_dir / "question.jsonl")[:2]
  turn2 = [template.generation_prompt(conversation(q, a["choices"][0]["turns"][:1],
                                                   a["attributes"], config.system),
                                      a["attributes"]) for q, a in zip(questions, answers)]
  got = generator.complete(turn2, config.max_new_tokens, seed=config.seed + 1)
  assert [c.text.strip() for c in got] == [a["choices"][0]["turns"][1].strip()
                                           for a in answers[:2]]


def test_attribute_model_judge(models, tmp_path):
  """Per-answer predictions equal scoring the conversations directly (turn 2 with the
  first exchange as context) and the reward is the HelpSteer2 weighting of them."""
  mt_dir = write_mt_bench(tmp_path / "mt")
  work = tmp_path / "run"
  work.mkdir()
  rows = [{"question_id": q["question_id"], "category": q["category"], "model_id": "tiny",
           "attributes": {"verbosity": 2}, "choices": [{"index": 0, "turns": [
               f"answer one to {q['question_id']}", "a second answer."]}],
           "finish_reasons": ["stop", "stop"], "tstamp": 0} for q in QUESTIONS]
  (work / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  config = eval_config(models, mt_dir, kind="attribute_model", scorer=str(models / "rm_hf"))
  config.steer_attributes = "verbosity"
  config.steer.verbosity = 2
  summary = evaluate_generation.run(config, str(work))
  assert summary["already_answered"] == 3
  judged = _rows(work / "judgments.jsonl")
  assert len(judged) == 6

  rt = runtime.setup(config)
  scorer = load_scorer(config.scorer, rt)
  questions = mt_bench_data.read_questions(mt_dir / "question.jsonl")
  convs = [conversation(q, r["choices"][0]["turns"][:t], r["attributes"], config.system,
                        ask_next=False) for q, r in zip(questions, rows) for t in (1, 2)]
  want = scorer(convs)
  got = np.array([[j["attributes"][a] for a in ATTRIBUTES] for j in judged])
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert np.ptp(want[:, -1]) > 0  # turn-2 context changes the prediction
  rewards = want @ weight_vector(HELPSTEER2_WEIGHTS)
  np.testing.assert_allclose([j["score"] for j in judged], rewards, atol=1e-4)
  table = summary["table"]
  assert table["overall"]["average"] == pytest.approx(float(np.mean(rewards)), abs=1e-4)
  assert "verbosity" in (work / "mt_bench.md").read_text()


def test_a_judge_that_judged_nothing_fails_after_writing_the_table(models, tmp_path):
  """Every answer turn unscored: mt_bench.json is written (each turn unparsed, no mean),
  and the run fails naming why instead of exiting 0."""
  mt_dir = write_mt_bench(tmp_path / "mt")
  work = tmp_path / "run"
  work.mkdir()
  rows = [{"question_id": q["question_id"], "category": q["category"], "model_id": "tiny",
           "attributes": {}, "choices": [{"index": 0, "turns": ["one.", "two."]}],
           "finish_reasons": ["stop", "stop"], "tstamp": 0} for q in QUESTIONS]
  (work / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  config = eval_config(models, mt_dir, kind="attribute_model",
                       scorer="fake_scorer:make_unscored")
  with pytest.raises(EvaluationError, match="none of the 3 questions' answer turns was"
                     " judged.*scorer function fake_scorer:make_unscored returned NaN"):
    evaluate_generation.run(config, str(work))
  overall = json.loads((work / "mt_bench.json").read_text())["table"]["overall"]
  assert (overall["judged"], overall["unparsed"], overall["average"]) == (6, 6, None)


def _fails_before_generation(config, work, error, match):
  with pytest.raises(error, match=match):
    evaluate_generation.run(config, str(work))
  assert not (work / "answers.jsonl").exists()


def test_bad_input_fails_before_generation(models, judge, tmp_path):
  mt_dir = write_mt_bench(tmp_path / "mt")
  _fails_before_generation(eval_config(models, mt_dir, f"http://127.0.0.1:{free_port()}/v1"),
                           tmp_path / "a", ConfigError, "cannot connect")
  config = eval_config(models, mt_dir, judge.url)
  config.judge.model = "gpt-9"
  _fails_before_generation(config, tmp_path / "b", ConfigError, "judge.model='gpt-9' is not"
                           f" served .* it serves {JUDGE}")
  config = eval_config(models, mt_dir, judge.url)
  config.steer.verbosity = 7
  _fails_before_generation(config, tmp_path / "c", ConfigError, "verbosity")
  config = eval_config(models, mt_dir, kind="attribute_model", scorer=str(tmp_path / "nope"))
  _fails_before_generation(config, tmp_path / "d", ConfigError, "scorer.source=.*no such")
  bad = tmp_path / "bad"
  shutil.copytree(mt_dir, bad)
  with open(bad / "question.jsonl", "a") as f:
    f.write('{"question_id": 200, "category": "math", "turns": "not a list"}\n')
  _fails_before_generation(eval_config(models, bad, judge.url), tmp_path / "e", DataError,
                           r"question.jsonl:4: 'turns' must be a non-empty list")
  with open(bad / "question.jsonl", "a") as f:
    f.write("{not json\n")
  with pytest.raises(DataError, match=r"question.jsonl:4"):
    mt_bench_data.read_questions(bad / "question.jsonl")


def test_fastchat_rating_parsing():
  """FastChat's one_score_pattern, then its backup pattern; -1 when neither matches."""
  assert mt_bench_grading.parse_rating("Good. Rating: [[7]]") == 7.0
  assert mt_bench_grading.parse_rating("Rating: [[8.5]] and later [[2]]") == 8.5
  assert mt_bench_grading.parse_rating("Rating: [6]") == 6.0
  assert mt_bench_grading.parse_rating("Rating: 6/10") == mt_bench_grading.UNPARSED


@pytest.mark.skipif(not SHARED_MT_BENCH.is_dir(),
                    reason="FastChat's MT-Bench files are not in ../shared/data/mt_bench")
def test_fastchat_files_give_every_grading_prompt():
  """All 80 questions of FastChat's files: both turns format with FastChat's judge prompts,
  math/reasoning/coding with GPT-4's references (FastChat's NEED_REF_CATS)."""
  files = mt_bench_data.MtBenchFiles.from_config({"dir": str(SHARED_MT_BENCH)})
  questions = mt_bench_data.with_references(mt_bench_data.read_questions(files.questions), files)
  prompts = mt_bench_data.read_judge_prompts(files.judge_prompts)
  assert len(questions) == 80 and len({q.category for q in questions}) == 8
  names = {}
  for q in questions:
    for turn in (1, 2):
      r = mt_bench_grading.judge_request(q, ["ANSWER ONE", "ANSWER TWO"], turn, prompts)
      names.setdefault(q.category, set()).add(r.prompt_name)
      assert r.system == prompts[r.prompt_name].system_prompt
      assert ("ANSWER TWO" in r.user) == (turn == 2) and "ANSWER ONE" in r.user
      if q.needs_reference:
        assert q.reference[0] in r.user
  assert names["math"] == {"single-math-v1", "single-math-v1-multi-turn"}
  assert names["writing"] == {"single-v1", "single-v1-multi-turn"}
