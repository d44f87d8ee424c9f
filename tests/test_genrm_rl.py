"""A GenRM trained by RL and used as a reward: HelpSteer3 rows as judge prompts with their
labels (the join of preference and feedback rows, ties dropped, bad rows by file and
line), the `genrm_verifier` source on the reward seam, the check that fails a run whose
prompts carry no reference before anything compiles, and a GenRM judging a group's
completions (`scorer.judge=genrm`): a fake judge's aggregation re-derived in NumPy, a
served judge behind best-of-n, a local one on the engine."""

import json
from unittest import mock

import httpx
import jax
import numpy as np
import openai
import pytest

from helpsteer_jax import runtime, sharding
from helpsteer_jax.config_sections import scorer_section
from helpsteer_jax.configs import rl as rl_config
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.errors import ConfigError, DataError
from helpsteer_jax.inference import best_of_n, generator, steering
from helpsteer_jax.inference.sampling import SamplingConfig
from helpsteer_jax.judges import genrm
from helpsteer_jax.models import builder, catalog, hf
from helpsteer_jax.runs import genrm_prompts, prompts
from helpsteer_jax.scoring import genrm as genrm_scoring
from helpsteer_jax.scoring import load, rewards
from helpsteer_jax.scoring.scorer import HostScorer, PrimaryScorer

from test_helpsteer3_data import write_rows

HELP = ATTRIBUTES.index("helpfulness")


def _context(question, earlier=None):
  turns = [{"role": "user", "content": question}]
  if earlier:
    turns = [{"role": "user", "content": earlier[0]},
             {"role": "assistant", "content": earlier[1]}] + turns
  return {"domain": "general", "language": "english", "context": turns}


def _feedback_strings(*levels):
  return [f"The response is {lvl} helpful. Reason {i}." for i, lvl in enumerate(levels)]


PREFERENCE = [
    {**_context("What is 2 plus 2?"), "response1": "4.", "response2": "5.",
     "overall_preference": -2, "individual_preference": [{"score": -2, "reasoning": "."}]},
    {**_context("Capital of Peru?", ("Hi", "Hello!")), "response1": "Cairo.",
     "response2": "Lima.", "overall_preference": 3, "individual_preference": []},
    {**_context("A tie?"), "response1": "a", "response2": "b", "overall_preference": 0,
     "individual_preference": []},
    {**_context("No feedback row"), "response1": "c", "response2": "d",
     "overall_preference": 1, "individual_preference": []},
    {**_context("Swapped feedback"), "response1": "e", "response2": "f",
     "overall_preference": -1, "individual_preference": []},
]
FEEDBACK = [
    {**_context("What is 2 plus 2?"), "response1": "4.", "response2": "5.",
     "feedback1": _feedback_strings("perfectly", "mostly", "perfectly"),  # 4.67 -> 5
     "feedback2": _feedback_strings("slightly", "partially")},             # 2.5 -> 3
    {**_context("Capital of Peru?", ("Hi", "Hello!")), "response1": "Cairo.",
     "response2": "Lima.", "feedback1": _feedback_strings("not"),
     "feedback2": ["No level here."]},                                      # h2 missing
    {**_context("Swapped feedback"), "response1": "f", "response2": "e",
     "feedback1": _feedback_strings("mostly"), "feedback2": _feedback_strings("not")},
]


@pytest.fixture
def hs3(tmp_path):
  write_rows(tmp_path, "preference", PREFERENCE)
  write_rows(tmp_path, "feedback", FEEDBACK)
  return tmp_path


def test_preference_rows_become_judge_prompts_with_their_labels(hs3):
  requests = genrm_prompts.read_requests(str(hs3), "train", {}, "sys", guidelines=False)
  refs = [r.extra["reference"] for r in requests]
  assert refs == [{"scores": [5, 3], "ranking": 2},       # -2 -> 2; means rounded half up
                  {"scores": [1, None], "ranking": 6},    # 3 -> 6; no level stated: None
                  {"scores": [None, None], "ranking": 4},  # 1 -> 4; no feedback row
                  {"scores": [1, 4], "ranking": 3}]       # feedback in the other order
  assert [r.extra["source"].rsplit(":", 1)[1] for r in requests] == ["1", "2", "4", "5"]
  first = requests[0]
  assert first.conversation.system == "sys" and len(first.conversation.turns) == 1
  assert first.prompt == genrm.prompt(
      Conversation("", (Turn("User", "What is 2 plus 2?"),)), ("4.", "5."), False)
  assert "User: Hi\n\nAssistant: Hello!\n\nUser: Capital of Peru?" in requests[1].prompt
  # the reference travels to the answered conversation, and the verifier reads it
  answered = first.answered(genrm.answer(genrm.Judgement((5, 2), 2)))
  assert answered.reference == {"scores": [5, 3], "ranking": 2}
  both = genrm_prompts.read_requests(str(hs3), "train", {}, "sys", both_orders=True)
  assert [r.extra["reference"] for r in both[:2]] == [
      {"scores": [5, 3], "ranking": 2}, {"scores": [3, 5], "ranking": 5}]
  assert "[The Begin of Response 1]\n5.\n" in both[1].prompt


def test_a_bad_row_names_its_file_and_line(hs3):
  write_rows(hs3, "preference", PREFERENCE[:2] + [{**PREFERENCE[0], "overall_preference": "x"}])
  with pytest.raises(DataError, match=r"preference/train.jsonl.gz.*3"):
    genrm_prompts.read_requests(str(hs3), "train", {}, "sys")
  write_rows(hs3, "feedback", FEEDBACK[:1] + ["{not json"])
  with pytest.raises(DataError, match=r"feedback/train.jsonl.gz.*2"):
    genrm_prompts.read_requests(str(hs3), "train", {}, "sys")
  write_rows(hs3, "preference", [{**PREFERENCE[2]}])  # ties only
  write_rows(hs3, "feedback", FEEDBACK)
  with pytest.raises(ConfigError, match="no HelpSteer3 preference row"):
    genrm_prompts.read_requests(str(hs3), "train", {}, "sys")


def test_the_verifier_source_rewards_answers_against_references(hs3):
  scorer = load.load_scorer(scorer_section(source="genrm_verifier"), None)
  assert isinstance(scorer, HostScorer)
  requests = genrm_prompts.read_requests(str(hs3), "train", {}, "sys")
  answers = [genrm.answer(genrm.Judgement((4, 3), 1)), "no boxes",
             genrm.answer(genrm.Judgement((2, 2), 6)), genrm.answer(genrm.Judgement((1, 4), 3))]
  rows = scorer([r.answered(a) for r, a in zip(requests, answers)])
  # |4-5| + |3-3| + |1-2|; a parse failure; only the ranking |6-4|; exact
  np.testing.assert_array_equal(rows[:, HELP], [-2.0, -100.0, -2.0, 0.0])
  assert np.all(np.delete(rows, HELP, axis=1) == 0)
  config = rl_config.get_config("genrm")
  weights = rewards.weight_vector(config.scorer.weights.to_dict())
  np.testing.assert_array_equal(rewards.rewards(rows, weights), rows[:, HELP])
  with pytest.raises(ConfigError, match="reference"):
    scorer([Conversation("", (Turn("User", "q"), Turn("Assistant", "a")))])


def test_prompts_without_references_fail_before_compiling(tmp_path, hs3):
  config = rl_config.get_config("genrm")
  plain = tmp_path / "plain.jsonl"
  plain.write_text(json.dumps({"prompt": "Judge these."}) + "\n")
  config.prompts.update(format="jsonl", train_path=str(plain))
  with pytest.raises(ConfigError, match="1 of 1 train prompts .* carry none"):
    prompts.read_prompts(config, {}, None, True, 400, "train")
  plain.write_text(json.dumps({"prompt": "Fine.", "reference": {"ranking": 2}}) + "\n\n"
                   + json.dumps({"prompt": "Judge.", "reference": {"scores": [9]}}) + "\n")
  with pytest.raises(ConfigError, match=r"plain.jsonl:3: reference.scores must be \[h1, h2\]"):
    prompts.read_prompts(config, {}, None, True, 400, "train")
  config.prompts.update(format="genrm", train_path="")
  with pytest.raises(ConfigError, match="prompts.train_path"):
    prompts.read_prompts(config, {}, None, True, 400, "train")
  # HelpSteer3 files: the train split for training, the validation split for evaluation
  tok = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path / "tok"))
  write_rows(hs3, "preference", PREFERENCE[:1], "validation")
  config.prompts.train_path = str(hs3)
  train = prompts.read_prompts(config, {}, tok, True, 400, "train")
  evals = prompts.read_prompts(config, {}, tok, True, 400, "eval")
  assert len(train) == 4 and len(evals) == 1
  assert evals[0].request.extra["reference"]["scores"] == [None, None]  # no validation feedback


def _convs():
  """Two groups: three answers to one context, then one answer alone."""
  a = Conversation("sys", (Turn("User", "2+2?"),))
  b = Conversation("sys", (Turn("User", "Capital of Peru?"),))
  return ([a.answered(t) for t in ("4", "5", "four")] + [b.answered("Lima")])


def test_a_judge_aggregates_each_groups_ordered_pairs():
  seen = []
  fixed = {("4", "5"): "\\boxed{5, 2}", ("5", "4"): "\\boxed{2, 5}", ("4", "four"): "junk"}

  def answer(texts):
    out = []
    for text in texts:
      one = text.split("[The Begin of Response 1]\n")[1].split("\n")[0]
      two = text.split("[The Begin of Response 2]\n")[1].split("\n")[0]
      seen.append((one, two))
      scores = fixed.get((one, two), f"\\boxed{{{len(one) % 5 + 1}, {len(two) % 5 + 1}}}")
      ranking = 1 if len(one) >= len(two) else 6
      out.append(f"{genrm.SCORES_SECTION[0]}{scores}{genrm.SCORES_SECTION[1]}"
                 f"{genrm.RANKING_SECTION[0]}\\boxed{{{ranking}}}{genrm.RANKING_SECTION[1]}")
    return out

  convs = _convs()
  judge = genrm_scoring.GenrmJudge(answer, "mean_score", guidelines=False)
  rows = judge(convs)
  texts = [c.turns[-1].text for c in convs]
  pairs = [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1), (3, 3)]
  assert seen == [(texts[i], texts[j]) for i, j in pairs]
  # NumPy: each completion's scores over the judgements that parsed
  table = {(i, j): genrm.parse(t) for (i, j), t in zip(pairs, answer(
      [genrm.prompt(Conversation("sys", c.turns[:-1]), (texts[i], texts[j]), False)
       for (i, j), c in zip(pairs, [convs[i] for i, _ in pairs])]))}
  assert table[(0, 2)].scores is None  # "junk" has no box: skipped
  sums, counts = np.zeros(4), np.zeros(4)
  for (i, j), judged in table.items():
    if judged.scores is not None:
      np.add.at(sums, [i, j], judged.scores)
      np.add.at(counts, [i, j], 1)
  np.testing.assert_allclose(rows[:, HELP], sums / counts, atol=1e-6)
  assert rows[3, HELP] == 5.0  # "Lima" against itself: (4 % 5 + 1) twice
  wins = genrm_scoring.GenrmJudge(answer, "win_count", guidelines=False)(convs)[:, HELP]
  # a longer-or-equal response 1 wins: "four" wins its 4 judgements; "4" and "5" each win
  # once of 4 (as response 1 against the other); "Lima" against itself: one win, one loss
  np.testing.assert_allclose(wins, [1 / 4, 1 / 4, 4 / 4, 0.5], atol=1e-6)
  with pytest.raises(ConfigError, match="aggregation"):
    genrm_scoring.GenrmJudge(answer, "borda")


def test_load_scorer_refuses_a_judge_without_a_language_model():
  section = scorer_section(source="genrm_verifier", judge="genrm")
  with pytest.raises(ConfigError, match="causal LM"):
    load.load_scorer(section, None)
  section = scorer_section(source="http://127.0.0.1:1/v1", judge="principal")
  with pytest.raises(ConfigError, match="judge='principal'"):
    load.load_scorer(section, None)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  root = tmp_path_factory.mktemp("judge")
  tok_dir = demo_tokenizer.build_demo_tokenizer(root / "tok")
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  hf.save_hf_model(model, root / "lm", dtype="float32", tokenizer=str(tok_dir))
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  gen = generator.Generator(generator.make_engine(model, mesh, hf.load_tokenizer(tok_dir),
                                                  max_batch=4, max_length=64,
                                                  stop_strings=()))
  return root, gen


def test_a_served_judge_ranks_best_of_n_candidates(tiny):
  """A server's chat completions as the judge of best-of-n's n candidates (process 0 asks
  through the project's OpenAI-compatible judge client; one request per judged pair)."""
  _, gen = tiny
  bodies = []

  def handler(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/models"):
      return httpx.Response(200, json={"object": "list", "data": [
          {"id": "genrm-70b", "object": "model", "created": 0, "owned_by": "me"}]})
    body = json.loads(request.content)
    bodies.append(body)
    text = body["messages"][1]["content"]
    one = text.split("[The Begin of Response 1]\n")[1].split("\n[The End")[0]
    two = text.split("[The Begin of Response 2]\n")[1].split("\n[The End")[0]
    score = lambda r: min(5, 1 + len(r) // 8)  # noqa: E731 - longer answers score higher
    content = genrm.answer(genrm.Judgement((score(one), score(two)), 1 if len(one) >= len(
        two) else 6), ["Looked at it."])
    return httpx.Response(200, json={
        "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}]})

  transport = httpx.MockTransport(handler)
  real = openai.OpenAI
  section = scorer_section(source="http://judge.test/v1", judge="genrm",
                           judge_max_new_tokens=32, aggregation="mean_score")
  with mock.patch.object(openai, "OpenAI", lambda **kw: real(
      **kw, http_client=httpx.Client(transport=transport))):
    scorer = load.load_scorer(section, None)
    assert isinstance(scorer, PrimaryScorer)
    requests = [steering.make_request("Name two fruits.", {"verbosity": 2})]
    weights = rewards.weight_vector({"helpfulness": 1.0})
    [result] = best_of_n.best_of_n(gen, requests, 3, scorer, weights, 8,
                                   SamplingConfig(temperature=1.0), seed=3)
  assert len(bodies) == 6  # the ordered pairs of 3 candidates
  assert all(b["model"] == "genrm-70b" and b["temperature"] == 0.0 and b["max_tokens"] == 32
             for b in bodies)  # the model the server lists, greedy
  lengths = [len(c.response) for c in result.candidates]
  assert [c.reward for c in result.candidates] == [
      float(min(5, 1 + n // 8)) for n in lengths]
  assert result.best == int(np.argmax([c.reward for c in result.candidates]))


def test_a_local_judge_answers_greedily_on_the_engine(tiny):
  """A causal LM (an HF directory) as the judge on the mesh: greedy, so the same rewards
  every call; a random model's answers do not parse (NaN: not scored)."""
  root, _ = tiny
  section = scorer_section(source=str(root / "lm"), judge="genrm", judge_max_new_tokens=8,
                           judge_guidelines=False, max_len=512, batch_size=4)
  config = rl_config.get_config()
  config.mesh.update(data=1, fsdp=-1, tensor=1)
  rt = runtime.setup(config)
  scorer = load.load_scorer(section, rt)
  assert isinstance(scorer, genrm_scoring.GenrmJudge)
  first = scorer.answer(["Judge: 1 or 2?"])
  assert first == scorer.answer(["Judge: 1 or 2?"]) and isinstance(first[0], str)
  rows = scorer(_convs()[:2])
  assert np.isnan(rows).all() and genrm.parse(first[0]) is None
  # a pair whose prompt leaves no room for the answer is not asked (not an error)
  assert scorer.answer(["Judge: 1 or 2?", "long " * 600]) == first + [None]
  assert scorer.counts == {"answered": 2, "not_asked": 0, "not_parsed": 2}


def test_the_genrm_preset_trains_on_helpsteer3_rows_through_the_rl_loop(hs3, tmp_path):
  """`rl:genrm` end to end on a tiny random policy: the HelpSteer3 rows as prompts, every
  answer checked by the verifier (a random policy's: parse failures), the references in
  the samples; the run reports a judge's measures (the share of answers that do not
  parse, the verifier reward), no steering distance, and exports its best evaluation.
  The demo's learning curve: docs/tasks/genrm.md."""
  from cli_utils import run_main
  tok = demo_tokenizer.build_demo_tokenizer(tmp_path / "tok")
  write_rows(hs3, "preference", PREFERENCE[:2], "validation")
  workdir = tmp_path / "run"
  proc = run_main("--config=configs/rl.py:genrm", "--config.init.source=",
                  f"--config.tokenizer={tok}", "--config.model.hidden_size=64",
                  "--config.model.intermediate_size=128", "--config.model.num_layers=2",
                  f"--config.prompts.train_path={hs3}", "--config.train.num_steps=1",
                  "--config.rollout.prompts_per_iteration=2",
                  "--config.rollout.max_new_tokens=8", "--config.train.global_batch=8",
                  "--config.train.micro_batch=8", "--config.train.seq_len=448",
                  "--config.train.export_dtype=float32", f"--workdir={workdir}", devices=1)
  metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [m["reward"] for m in metrics if "reward" in m] == [-100.0]
  assert [m["parse_failures"] for m in metrics if "reward" in m] == [1.0]
  assert [(m["step"], m["eval_parse_failures"]) for m in metrics
          if "eval_reward" in m] == [(0, 1.0), (1, 1.0)]
  assert not any("steer_distance" in k for m in metrics for k in m)
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["eval_parse_failures_before"] == summary["eval_parse_failures_after"] == 1.0
  assert summary["eval_reward_before"] == summary["eval_reward_after"] == -100.0
  assert not any("steer" in k for k in summary)
  # Iterations 0 and 1 tie on the preset's export_best=reward (max): the earlier wins.
  assert summary["export"] == {"step": 0, "chosen_by": "best eval reward (max)",
                               "metric": "reward", "value": -100.0, "mode": "max"}
  assert ("greedy verifier reward on 2 held-out prompts -100.000 (iteration 0) -> -100.000"
          " (iteration 1); unparsed answers 100.0% -> 100.0%") in proc.stdout
  assert "steering distance" not in proc.stdout
  assert "exported iteration 0, the best eval reward (max) -100.0000" in proc.stdout
  samples = [json.loads(line) for line in
             (workdir / "samples" / "iteration_000001.jsonl").read_text().splitlines()]
  assert [s["reference"] for s in samples] == [{"scores": [None, None], "ranking": 2},
                                               {"scores": [None, None], "ranking": 6}]
  assert all(s["reward"] == -100.0 for s in samples)


def test_a_genrm_judge_without_an_answer_budget_is_refused():
  from helpsteer_jax.scoring.load import load_scorer
  section = scorer_section(source="http://127.0.0.1:9/v1", judge="genrm",
                           judge_max_new_tokens=0)
  with pytest.raises(ConfigError, match="judge_max_new_tokens=0: a GenRM writes its answer"):
    load_scorer(section, None)
