"""A principle judge (RLBFF) as a policy's reward (`scorer.judge=principle`): on a tiny
random causal LM, the reward equals log p(" Yes") - log p(" No") after the judge's
`Final Judgement:` from an independent one-row forward pass of the same model (fp32,
within BATCH_ATOL: fp32 accumulation over the model's depth in another reduction order),
with no reasoning and after its own greedy reasoning (decoded here token by token by full
forward passes; each greedy token leads the runner-up by far more than that); the served
form's reading of `/v1/completions` top alternatives (and its reasoning request first); and
the attribute model plus the judge as one reward (`scorer.principle_source`)."""

import json
import math
import types

import httpx
import jax
import ml_collections
import numpy as np
import pytest

from helpsteer_jax import config_base, runtime
from helpsteer_jax.config_sections import scorer_section
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.judges import principle
from helpsteer_jax.models import builder, catalog, hf
from helpsteer_jax.scoring import load, principle_judge, rules
from helpsteer_jax.scoring.combine import CombinedScorer
from helpsteer_jax.scoring.scorer import REWARD_SLOT, HostScorer

from tolerances import BATCH_ATOL

SLOT = ATTRIBUTES.index(REWARD_SLOT)
PRINCIPLE = "The response is a haiku."
SHAPE = dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=2,
             initializer_range=0.5)


def _rt():
  config = ml_collections.ConfigDict({"mesh": {"data": 2, "fsdp": 2, "tensor": 2}})
  from helpsteer_jax import sharding
  config.sharding_rules = tuple(sharding.DEFAULT_RULES)
  return runtime.setup(config)


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("judge")
  tok_dir = demo_tokenizer.build_demo_tokenizer(root / "tok")
  model = builder.create(catalog.model_config("tiny", **SHAPE), seed=5)
  hf.save_hf_model(model, root / "hf", dtype="float32", tokenizer=str(tok_dir))
  return root / "hf", model


def _section(source, **kw):
  return scorer_section(**{"source": str(source), "judge": "principle",
                           "principle": PRINCIPLE, "batch_size": 8, "max_len": 512,
                           "judge_max_new_tokens": 0,
                           "model": config_base.model_section("tiny", attention_block_size=32),
                           **kw})


CONVS = [
    Conversation("", (Turn("User", "Write a haiku about rain."),
                      Turn("Assistant", "Rain taps the window."))),
    Conversation("Be brief.", (Turn("User", "Hi"), Turn("Assistant", "Hello!"),
                               Turn("User", "A haiku on snow?"),
                               Turn("Assistant", "Snow falls soft and slow " * 5))),
    Conversation("", (Turn("User", "Sum 2 and 2."), Turn("Assistant", "4")),
                 reference={"principle": "The answer is correct."}),
    Conversation("", (Turn("User", "Long?"), Turn("Assistant", "word " * 600))),  # too long
]


def _independent(model, tok, conv, reasoning: str = "") -> float:
  """log p(yes) - log p(no) after the judge's input (after `reasoning`), from the model's
  own forward pass and a NumPy log-softmax of its last position's logits."""
  tokens = principle.verdict_tokens(lambda s: tok(s, add_special_tokens=False)["input_ids"])
  text = principle_judge.judge_text(conv, PRINCIPLE, reasoning)
  ids = [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"] + list(tokens.prefix)
  logits = np.asarray(jax.jit(lambda m, x: m.logits(m(x)))(model, np.asarray([ids]))[0, -1],
                      np.float64)
  logp = logits - logits.max() - np.log(np.sum(np.exp(logits - logits.max())))
  return logp[tokens.yes] - logp[tokens.no]


def test_the_reward_is_the_judges_verdict_log_ratio(judge_dir):
  source, model = judge_dir
  scorer = load.load_scorer(_section(source), _rt())
  scorer.warm_up()
  assert scorer.compiled_variants == scorer.warm_up_programs
  got = scorer(CONVS)
  tok = hf.load_tokenizer(str(source))
  expected = [_independent(model, tok, c) for c in CONVS[:3]]
  # The scorer's batch against one-row passes: fp32 sums over the model's depth in another
  # order (XLA:CPU blocks a matmul by its shapes), not bitwise equal (tests/tolerances.py).
  np.testing.assert_allclose(got[:3, SLOT], expected, rtol=0, atol=BATCH_ATOL)
  assert np.all(np.delete(got[:3], SLOT, axis=1) == 0)
  assert np.isnan(got[3]).all()  # longer than scorer.max_len: not scored
  assert len(set(np.round(got[:3, SLOT], 6))) == 3
  # the reference's principle is the one judged (the configured one otherwise)
  assert "The answer is correct." in principle_judge.judge_text(CONVS[2], PRINCIPLE)
  no_principle = load.load_scorer(_section(source, principle=""), _rt())
  with pytest.raises(ConfigError, match="scorer.principle"):
    no_principle(CONVS[:1])


def _greedy(model, tok, prompt: str, budget: int, length: int = 512) -> str:
  """The judge's greedy reasoning after `prompt`, a full forward pass per token (right
  padded to `length`; causal, so the padding changes nothing before it): ended by an EOS
  id, cut at the turn marker or at `Final Judgement:`, at most `budget` tokens."""
  from helpsteer_jax.inference.generator import eos_ids
  step = jax.jit(lambda m, x: m.logits(m(x)))
  ids = [tok.bos_token_id] + tok(prompt, add_special_tokens=False)["input_ids"]
  eos, new = eos_ids(tok, model.cfg.eos_token_id), []
  for _ in range(budget):
    x = np.zeros((1, length), np.int32)
    x[0, :len(ids) + len(new)] = ids + new
    logits = np.asarray(step(model, x))[0, len(ids) + len(new) - 1]
    token = int(np.argmax(logits))
    top2 = np.sort(logits)[-2:]
    # A clear winner, so the batched engine's greedy choice is this one too.
    assert top2[1] - top2[0] > 100 * BATCH_ATOL, (tok.decode(new), top2)
    if token in eos:
      break
    new.append(token)
    text = tok.decode(new, skip_special_tokens=False)
    for stop in (principle.JUDGEMENT, "<extra_id_1>"):
      if stop in text:
        return text[:text.index(stop)]
  return tok.decode(new, skip_special_tokens=False)


def test_a_reasoning_judge_judges_after_its_own_greedy_reasoning(judge_dir):
  from helpsteer_jax.inference.principle_reasoning import ReasoningJudge
  source, model = judge_dir
  scorer = load.load_scorer(_section(source, judge_max_new_tokens=12), _rt())
  assert isinstance(scorer, ReasoningJudge)
  got = scorer(CONVS)
  tok = hf.load_tokenizer(str(source))
  prompts = [principle_judge.judge_prompt_text(c, PRINCIPLE) for c in CONVS[:3]]
  reasoning = [_greedy(model, tok, p, 12) for p in prompts]
  assert scorer.reasoning(prompts) == reasoning and all(reasoning)
  expected = [_independent(model, tok, c, r) for c, r in zip(CONVS[:3], reasoning)]
  np.testing.assert_allclose(got[:3, SLOT], expected, rtol=0, atol=BATCH_ATOL)
  assert np.all(np.delete(got[:3], SLOT, axis=1) == 0)
  assert np.isnan(got[3]).all()  # no room to reason, and too long to judge
  one_pass = [_independent(model, tok, c) for c in CONVS[:3]]
  assert np.abs(np.subtract(expected, one_pass)).min() > 1e-3  # the reasoning is read
  with pytest.raises(ConfigError, match="judge_max_new_tokens=-1"):
    load.load_scorer(_section(source, judge_max_new_tokens=-1), _rt())


def test_the_judgement_follows_the_reasoning():
  """A reasoning that ends its line (as a judge writes before its verdict) is followed by
  `Final Judgement:` as written; one cut by the budget gets it on a new line."""
  j = principle.JUDGEMENT
  assert principle_judge.continued("") == j
  assert principle_judge.continued("It rhymes.\n\n") == "It rhymes.\n\n" + j
  assert principle_judge.continued("It rhymes. ") == "It rhymes. " + j
  assert principle_judge.continued("The response is") == "The response is\n" + j
  conv = CONVS[0]
  assert principle_judge.judge_text(conv, PRINCIPLE) == (
      principle_judge.judge_prompt_text(conv, PRINCIPLE) + j)


def test_the_judges_input_ends_at_its_final_judgement():
  text = principle_judge.judge_text(CONVS[1], PRINCIPLE)
  assert text.endswith("<extra_id_1>Assistant\n<extra_id_2>\nFinal Judgement:")
  assert "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello!\n\nUser: A haiku on snow?" in text
  assert "[Response]\nSnow falls soft" in text
  policy = Conversation(principle_judge.template.DEFAULT_SYSTEM, CONVS[0].turns)
  assert "System:" not in principle_judge.judge_text(policy, PRINCIPLE)


def test_a_served_judge_reads_the_top_alternatives(monkeypatch):
  seen = []

  def handler(request):
    body = json.loads(request.content)
    seen.append(body)
    tops = [{" Yes": -0.25, " No": -1.5, "x": -3.0}, {" Yes": -0.1, "x": -3.0},
            {" No": -0.01, " Yes": -5.0}]
    return httpx.Response(200, json={"choices": [
        {"index": i, "text": " Yes", "finish_reason": "length",
         "logprobs": {"tokens": [" Yes"], "token_logprobs": [-0.1], "top_logprobs": [t],
                      "text_offset": [0]}} for i, t in enumerate(tops[:len(body["prompt"])])]})

  judge = principle_judge.HttpJudge("http://judge:8000/v1", PRINCIPLE, batch_size=3)
  monkeypatch.setattr(judge, "_httpx", types.SimpleNamespace(
      Client=lambda **kw: httpx.Client(transport=httpx.MockTransport(handler), **kw)))
  got = judge(CONVS[:3])
  np.testing.assert_allclose(got[:, SLOT], [1.25, principle_judge.MISSING_REWARD, -4.99])
  assert seen[0]["max_tokens"] == 1 and seen[0]["logprobs"] == 20
  assert seen[0]["prompt"][0].endswith("Final Judgement:")
  assert principle_judge.served_reward([{}]) == principle_judge.MISSING_REWARD
  assert math.isclose(principle_judge.served_reward([{" Yes": -2.0, " No": -0.5}]), -1.5)


def test_a_served_judge_reasons_with_a_first_request(monkeypatch):
  """With judge_max_new_tokens: a greedy request stopped at `Final Judgement:` writes the
  reasoning, then the one-token request reads the verdict after it."""
  seen, reasoning = [], ["It rhymes.\n", "The response is", ""]

  def handler(request):
    body = json.loads(request.content)
    seen.append(body)
    if "stop" in body:
      return httpx.Response(200, json={"choices": [
          {"index": i, "text": reasoning[i], "finish_reason": "stop", "logprobs": None}
          for i in reversed(range(len(body["prompt"])))]})
    return httpx.Response(200, json={"choices": [
        {"index": i, "text": " Yes", "finish_reason": "length",
         "logprobs": {"tokens": [" Yes"], "token_logprobs": [-0.1],
                      "top_logprobs": [{" Yes": -0.5 * i, " No": -2.0}], "text_offset": [0]}}
        for i in range(len(body["prompt"]))]})

  judge = principle_judge.HttpJudge("http://judge:8000/v1", PRINCIPLE, batch_size=3,
                                    max_new_tokens=64)
  monkeypatch.setattr(judge, "_httpx", types.SimpleNamespace(
      Client=lambda **kw: httpx.Client(transport=httpx.MockTransport(handler), **kw)))
  got = judge(CONVS[:3])
  np.testing.assert_allclose(got[:, SLOT], [2.0, 1.5, 1.0])
  first, second = seen
  prompts = [principle_judge.judge_prompt_text(c, PRINCIPLE) for c in CONVS[:3]]
  assert first["prompt"] == prompts and first["stop"] == [principle.JUDGEMENT]
  assert first["max_tokens"] == 64 and first["temperature"] == 0.0
  assert second["prompt"] == [principle_judge.judge_text(c, PRINCIPLE, r)
                              for c, r in zip(CONVS[:3], reasoning)]
  assert second["prompt"][1].endswith("The response is\nFinal Judgement:")
  assert second["max_tokens"] == 1 and second["logprobs"] == 20


def test_the_attribute_model_and_the_judge_as_one_reward(judge_dir):
  source, _ = judge_dir
  section = _section("", principle_source=str(source), principle_coef=0.5)
  section.update(judge="", source=rules.DEMO_RULES)
  combined = load.load_scorer(section, _rt())
  assert isinstance(combined, CombinedScorer)
  judge = load.load_scorer(_section(source), _rt())
  attribute = HostScorer(rules.demo_rule_scores)
  got, a, j = combined(CONVS), attribute(CONVS), judge(CONVS)
  expected = a.copy()
  expected[:, SLOT] += np.float32(0.5) * j[:, SLOT]
  np.testing.assert_array_equal(got[:3], expected[:3])
  assert np.isnan(got[3, SLOT]) and np.array_equal(got[3, :SLOT], a[3, :SLOT])
  assert combined.local_rows > 0


def test_the_judge_scores_the_input_rl_principle_trains_it_on(tmp_path):
  """A HelpSteer3 principle row's RL prompt (rl:principle) followed by `Final Judgement:`
  is exactly the judge's input for that response and principle."""
  import gzip

  from helpsteer_jax.config_sections import DEFAULT_SYSTEM
  from helpsteer_jax.data.formats import helpsteer3
  from helpsteer_jax.runs import prompts as prompts_lib

  from train_utils import task_config
  row = {"domain": "general", "language": "english", "response": "Snow falls soft.",
         "context": [{"role": "user", "content": "A haiku on rain?"},
                     {"role": "assistant", "content": "Rain taps."},
                     {"role": "user", "content": "And snow?"}],
         "principle": PRINCIPLE, "fulfilment": "Yes"}
  path = tmp_path / "principle.jsonl.gz"
  with gzip.open(path, "wt") as f:
    f.write(json.dumps(row) + "\n")
  config = task_config("rl", preset="principle")
  config.prompts.train_path = str(path)
  (request,) = prompts_lib.read_requests("", "train", {}, config)
  (record,) = helpsteer3.read_helpsteer3(path, "principle")
  answered = record.context.answered(record.response)
  policy_side = Conversation(DEFAULT_SYSTEM, answered.turns)  # as a policy's rollout
  expected = request.prompt_text() + principle.JUDGEMENT
  assert principle_judge.judge_text(policy_side, PRINCIPLE) == expected
  assert principle_judge.judge_text(answered, "another principle") != expected
