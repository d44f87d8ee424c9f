"""Generative judges behind the server.

- /v1/rewards with a principle judge (RLBFF) as the server's scorer: the served rewards
  equal the local scorer's (`scoring.load.load_scorer` in this process, the same config
  section) on the same conversations, the judge reasoning first as configured; so do
  OpenRLHF's `/get_reward` rewards of the rendered conversations, at the configured
  weights.
- A GenRM: NeMo-RL's GenRM request (NeMo-Gym's chat-completions body, `response_1` /
  `response_2` roles; source below) answered by the served model with the text the same
  model gives as a local judge (`inference.judge.EngineAnswers`, greedy) for the same
  pair; `/get_reward` with a GenRM scorer (`scorer.judge=genrm`) equal to the local
  scorer's rewards on the same conversations; bad comparison bodies a 400.

The principle judge is the serve tests' tiny random policy (a causal LM with the demo
tokenizer), served by a server of its own (one CPU device) whose scorer section names it;
warmed up, it compiles nothing while the judge reasons and scores. The GenRM scorer is a
tiny model whose weights make it write `\\boxed{4, 2}` after any prompt (a parseable
judgement: a random model's answers never parse), on a second server that serves the
random policy for the chat comparison.
"""

import json
import re

import httpx
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import transformers

from helpsteer_jax import config_base, runtime, sharding
from helpsteer_jax.config_sections import HELPSTEER2_WEIGHTS, scorer_section
from helpsteer_jax.data import template
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.judges import genrm
from helpsteer_jax.models import builder, catalog, hf
from helpsteer_jax.scoring.load import load_scorer
from helpsteer_jax.scoring.scorer import REWARD_SLOT
from helpsteer_jax.serve import judge_chat, protocol

from serve_utils import KEY, SCORER_MAX_LEN, Server

PRINCIPLE = "The response answers the question."
STEPS = 6  # the judge's reasoning budget


def test_rewards_of_a_principle_judge_equal_the_local_scorer(served_models, tmp_path):
  judge = served_models / "policy"
  server = Server(served_models, tmp_path, "--config.scorer.judge=principle",
                  f"--config.scorer.source={judge}", "--config.scorer.head=",
                  f"--config.scorer.principle={PRINCIPLE}",
                  f"--config.scorer.judge_max_new_tokens={STEPS}")
  try:
    items = [([{"role": "user", "content": "What is 2 plus 3?"}], "It is 5."),
             ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
               {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}],
              "Goodbye!")]
    body = {"items": [{"messages": m, "response": r} for m, r in items],
            "weights": {"helpfulness": 1.0}}
    response = server.post("rewards", body)
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    # OpenRLHF's /get_reward on the same conversations, rendered: the configured weighting
    # (HelpSteer2's) of the judge's reward in the helpfulness column.
    texts = [template.regression_text(c) for c in _convs(items)]
    openrlhf = httpx.post(f"{server.base}/get_reward", json={"query": texts}, timeout=300,
                          headers={"Authorization": f"Bearer {KEY}"}).json()
    assert server.stats()["compiles"] == server.warm_compiles
  finally:
    server.stop()
  got = np.asarray([[row["attributes"][n] for n in ATTRIBUTES] for row in data])
  section = scorer_section(source=str(judge), judge="principle", principle=PRINCIPLE,
                           judge_max_new_tokens=STEPS, max_len=SCORER_MAX_LEN,
                           model=config_base.model_section("tiny"))
  want = _local(section)(_convs(items))
  slot = ATTRIBUTES.index(REWARD_SLOT)
  assert np.isfinite(want[:, slot]).all() and len(set(want[:, slot])) == 2
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
  np.testing.assert_allclose([row["reward"] for row in data], want[:, slot], rtol=0, atol=1e-4)
  np.testing.assert_allclose(openrlhf["rewards"],
                             HELPSTEER2_WEIGHTS[REWARD_SLOT] * want[:, slot], rtol=0, atol=1e-4)
  np.testing.assert_allclose(openrlhf["extra_logs"][REWARD_SLOT], want[:, slot], rtol=0,
                             atol=1e-4)


def _convs(items):
  return [protocol.scored_conversation([protocol.Message(**x) for x in m], r)
          for m, r in items]


def _local(section):
  config = {"mesh": {"data": 2, "fsdp": 2, "tensor": 2},
            "sharding_rules": tuple(sharding.DEFAULT_RULES)}
  return load_scorer(section, runtime.setup(ml_collections.ConfigDict(config)))


# NeMo-RL's GenRM request, as NeMo-Gym sends it to a GenRM at a base URL (NVIDIA-NeMo/Gym,
# resources_servers/genrm_compare/app.py `_run_single_comparison`: the conversation history
# as input, the responses in metadata, `genrm_responses_create_params` (max_output_tokens,
# temperature, top_p); responses_api_models/genrm_model/app.py `GenRMModelMixin` appends
# {"role": "response_1"}, {"role": "response_2"}; nemo_gym/responses_converter.py
# max_output_tokens -> max_tokens; vllm_model/app.py sets `model`). Greedy (temperature 0),
# so that the local judge's answer is the reference.
HISTORY = [{"role": "user", "content": "What is 2 plus 3?"},
           {"role": "assistant", "content": "Do you mean in base ten?"},
           {"role": "user", "content": "Yes."}]
PAIR = ("It is 5.", "Five, I think.")
GENRM_STEPS = 8  # the served (random) judge's answer budget
GENRM_ANSWER = "\\boxed{4, 2}"  # what the crafted GenRM writes: 10 tokens, then EOS
ANSWER_STEPS = 12  # the crafted GenRM's budget as the server's scorer


def nemo_gym_body(messages, pair, max_tokens):
  return {"messages": [*messages, {"role": "response_1", "content": pair[0]},
                       {"role": "response_2", "content": pair[1]}],
          "model": "tiny", "max_tokens": max_tokens, "temperature": 0.0, "top_p": 0.95}


def nemo_gym_parse(text):
  """NeMo-Gym's `parse_genrm_output` (genrm_compare/utils.py), re-derived for the flat
  case: the last top-level JSON object with score_1 / score_2 / ranking (its defaults
  3.0 / 3.5 where a key is missing), None when there is none."""
  found = None
  for match in re.finditer(r"\{[^{}]*\}", text):
    try:
      parsed = json.loads(match.group(0))
    except json.JSONDecodeError:
      continue
    if isinstance(parsed, dict) and {"score_1", "score_2", "ranking"} & set(parsed):
      found = (float(parsed.get("score_1", 3.0)), float(parsed.get("score_2", 3.0)),
               float(parsed.get("ranking", 3.5)))
  return found


def write_genrm(out, tok_dir):
  """A tiny causal LM that writes `GENRM_ANSWER` then EOS after any prompt: attention and
  MLP outputs are zero, so the last position's logits are its token's alone; each token
  of the answer has its own embedding direction, every other token one shared direction,
  and the LM head maps each direction to the next token of the answer."""
  chain = transformers.AutoTokenizer.from_pretrained(str(tok_dir))(
      GENRM_ANSWER, add_special_tokens=False)["input_ids"]
  assert len(set(chain)) == len(chain)
  cfg = catalog.model_config("tiny")
  model = builder.create(cfg, seed=0)
  embed = np.zeros((cfg.vocab_size, cfg.hidden_size), np.float32)
  head = np.zeros((cfg.hidden_size, cfg.vocab_size), np.float32)
  embed[:, len(chain)] = 1.0
  head[len(chain), chain[0]] = 10.0
  for k, token in enumerate(chain):
    embed[token] = np.eye(cfg.hidden_size)[k]
    head[k, chain[k + 1] if k + 1 < len(chain) else cfg.eos_token_id] = 10.0
  model.embed.value, model.lm_head.value = jnp.asarray(embed), jnp.asarray(head)
  for layer in (model.layers.attn.o_proj, model.layers.mlp.down_proj):
    layer.value = jnp.zeros_like(layer.value)
  hf.save_hf_model(model, out, dtype="float32", tokenizer=str(tok_dir))
  return out


def test_a_genrm_comparison_body_maps_to_the_judge_prompt_and_its_answer_to_json():
  """NeMo-Gym's roles -> this project's GenRM prompt; the answer -> NeMo-Gym's JSON."""
  msgs = [protocol.Message(**m) for m in nemo_gym_body(HISTORY, PAIR, 8)["messages"]]
  context = Conversation("", (Turn("User", "What is 2 plus 3?"),
                              Turn("Assistant", "Do you mean in base ten?"), Turn("User", "Yes.")))
  assert judge_chat.judge_prompt(msgs, False) == genrm.prompt(context, PAIR, False)
  system = [protocol.Message(role="system", content="Be brief."), *msgs]
  assert judge_chat.judge_prompt(system, True) == genrm.prompt(
      Conversation("Be brief.", context.turns), PAIR, True)
  assert judge_chat.judge_prompt(msgs[:3], True) is None  # an ordinary chat
  for bad in (msgs[:-1], [msgs[0], msgs[-1], msgs[-2]], [*msgs[:2], *msgs[3:]], msgs[3:],
              [*msgs[:3], protocol.Message(role="principle", content="Be right."), *msgs[3:]]):
    with pytest.raises(protocol.ApiError):
      judge_chat.judge_prompt(bad, True)
  full = genrm.answer(genrm.Judgement((4, 2), 2), ["Good.", "Vague."])
  assert nemo_gym_parse(judge_chat.answer_text(full)) == (4.0, 2.0, 2.0)
  assert judge_chat.answer_text(full).startswith(full + "\n")
  assert nemo_gym_parse(judge_chat.answer_text(GENRM_ANSWER)) == (4.0, 2.0, 3.5)
  assert judge_chat.answer_text("no boxes") == "no boxes"


def test_a_served_genrm_answers_nemo_rls_request_and_get_reward_as_locally(served_models,
                                                                           tmp_path):
  judge = write_genrm(tmp_path / "genrm", served_models / "tok")
  server = Server(served_models, tmp_path, "--config.serve.warmup=false",
                  "--config.scorer.judge=genrm", f"--config.scorer.source={judge}",
                  "--config.scorer.head=", "--config.scorer.judge_guidelines=false",
                  f"--config.scorer.judge_max_new_tokens={ANSWER_STEPS}")
  auth = {"Authorization": f"Bearer {KEY}"}
  groups = [("What is 2 plus 3?", ("It is 5.", "Five.", "5")), ("bye", ("Goodbye!",))]
  items = [([{"role": "user", "content": q}], r) for q, answers in groups for r in answers]
  try:
    with httpx.Client(base_url=server.base, headers=auth, timeout=300) as http:
      chat = http.post("/v1/chat/completions",
                       json=nemo_gym_body(HISTORY, PAIR, GENRM_STEPS))
      assert chat.status_code == 200, chat.text
      texts = [template.regression_text(c) for c in _convs(items)]
      openrlhf = http.post("/get_reward", json={"query": texts})
      assert openrlhf.status_code == 200, openrlhf.text
      # a completion whose pair's prompt leaves no room for the answer is not judged
      long = _convs([([{"role": "user", "content": "hi"}], "long " * 600)])[0]
      unjudged = http.post("/get_reward", json={"query": [template.regression_text(long)]})
      assert unjudged.status_code == 400 and unjudged.json()["error"]["code"] == "not_judged"
      bad = [http.post("/v1/chat/completions", json=nemo_gym_body(HISTORY, PAIR, 4) | patch)
             for patch in ({"messages": HISTORY + [{"role": "response_1", "content": "x"}]},
                           {"messages": [{"role": "principle", "content": "Be right."},
                                         *nemo_gym_body(HISTORY, PAIR, 4)["messages"]]},
                           {"stream": True})]
      assert [b.status_code for b in bad] == [400, 400, 400], [b.text for b in bad]
      rewards_item = http.post("/v1/rewards", json={"items": [
          {"messages": [{"role": "response_1", "content": "x"}], "response": "x"}]})
      assert rewards_item.status_code == 400, rewards_item.text
  finally:
    server.stop()
  model = config_base.model_section("tiny")
  # The same model as a local judge: the same prompt, rendered alike, answered greedily.
  local = _local(scorer_section(source=str(served_models / "policy"), judge="genrm",
                                judge_max_new_tokens=GENRM_STEPS, judge_guidelines=False,
                                max_len=SCORER_MAX_LEN, model=model))
  context = protocol.conversation([protocol.Message(**m) for m in HISTORY], system="")
  [answer] = local.answer([genrm.prompt(context, PAIR, False)])
  assert answer and chat.json()["choices"][0]["message"]["content"] == (
      judge_chat.answer_text(answer))
  # /get_reward: the local GenRM scorer's rewards on the same conversations. Every
  # judgement is "\\boxed{4, 2}": 4 for the pair's first, 2 for its second; each completion
  # is first as often as second (both orders; a group of one against itself): 3.
  want = _local(scorer_section(source=str(judge), judge="genrm", judge_guidelines=False,
                               judge_max_new_tokens=ANSWER_STEPS, max_len=SCORER_MAX_LEN,
                               model=model))(_convs(items))
  slot = ATTRIBUTES.index(REWARD_SLOT)
  np.testing.assert_allclose(want[:, slot], [3.0] * len(items), rtol=0, atol=1e-6)
  got = openrlhf.json()
  np.testing.assert_allclose(got["rewards"], HELPSTEER2_WEIGHTS[REWARD_SLOT] * want[:, slot],
                             rtol=0, atol=1e-5)
  assert got["scores"] == got["rewards"]
  assert got["extra_logs"] == {REWARD_SLOT: [float(v) for v in want[:, slot]]}
