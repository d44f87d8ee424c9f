"""The reward routes in the RL frameworks' protocols: OpenRLHF's `/get_reward` and vLLM's
pooling `/classify` (verl's discriminative reward model), on the session's server.

References:
- the bodies as the frameworks' clients send them, copied from their code (neither client
  installs on CPU): OpenRLHF's `openrlhf/utils/remote_rm_utils.py` (`remote_rm_fn_ray` ->
  `request_api_wrapper`: `{"query": queries, "prompts": prompts, "labels": labels}`,
  reading `rewards`, `scores`, `extra_logs`); verl's
  `verl/experimental/reward_loop/reward_loop.py` (`compute_score_disrm`: `{"model",
  "input", "activation": False}` to `/classify`, reading `data[-1]["probs"][-1]`; vLLM
  0.11.2's `use_activation` / `add_special_tokens` spelling);
- vLLM's `ClassificationResponse` (`id`, `object`, `created`, `model`, `data` of `index`,
  `label`, `probs`, `num_classes`, `usage`);
- the conversations rendered as the attribute model's input (`template.regression_text`)
  and as a SteerLM actor's sequences decode (`template.generation_prompt`, the answer,
  BOS / EOS / padding tokens kept);
- `/v1/rewards` on the same conversations, NumPy's weighting of its predictions, and
  transformers' PyTorch forward of the served attribute model's backbone with its head
  file applied in NumPy.

Neither client sends an API key; the session's server has one, so these requests add the
header to the frameworks' bodies (docs/tasks/serve.md: serve them on loopback without one).
"""

import httpx
import numpy as np
import pytest
from torch_reference import needs_torch, torch

from helpsteer_jax import config_sections
from helpsteer_jax.data import template
from helpsteer_jax.data.features.regression_ids import RegressionTokenizer
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.models import hf
from helpsteer_jax.scoring import rewards
from helpsteer_jax.serve import protocol

from serve_utils import KEY, SCORER_MAX_LEN

AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
ITEMS = [([{"role": "user", "content": "What is 2 plus 3?"}], "It is 5."),
         ([{"role": "user", "content": "What is 2 plus 3?"}], "Five, I think."),
         ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
           {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}],
          "Goodbye!")]


def _convs():
  return [protocol.scored_conversation([protocol.Message(**m) for m in messages], response)
          for messages, response in ITEMS]


TEXTS = [template.regression_text(c) for c in _convs()]


@pytest.fixture()
def http(server):
  with httpx.Client(base_url=server.base, headers=AUTH, timeout=120) as client:
    yield client


@pytest.fixture()
def reference(http) -> tuple[np.ndarray, np.ndarray]:
  """/v1/rewards' [n, 9] predictions and [n] rewards of ITEMS."""
  rows = http.post("/v1/rewards", json={"items": [{"messages": m, "response": r}
                                                  for m, r in ITEMS]}).json()["data"]
  return (np.asarray([[row["attributes"][n] for n in ATTRIBUTES] for row in rows]),
          np.asarray([row["reward"] for row in rows]))


def test_get_reward_takes_openrlhfs_body_and_equals_v1_rewards(server, http, reference):
  preds, want = reference
  # OpenRLHF's remote_rm_fn_ray(api_url, queries, prompts, labels): the prompt is the
  # query's text up to the response; labels are the dataset's (strings, unused here).
  prompts = [t[:t.rindex("<extra_id_1>Assistant\n")] for t in TEXTS]
  body = {"query": TEXTS, "prompts": prompts, "labels": ["", "5", ""]}
  response = http.post("/get_reward", json=body)
  assert response.status_code == 200, response.text
  got = response.json()
  assert sorted(got) == ["extra_logs", "rewards", "scores"]
  np.testing.assert_allclose(got["rewards"], want, rtol=1e-6, atol=1e-6)
  assert got["scores"] == got["rewards"]
  assert sorted(got["extra_logs"]) == sorted(ATTRIBUTES)
  np.testing.assert_allclose(np.asarray([got["extra_logs"][n] for n in ATTRIBUTES]).T, preds,
                             rtol=1e-6, atol=1e-6)
  # The configured weighting (configs/serve.py: HelpSteer2's), re-derived in NumPy.
  weights = np.asarray([config_sections.HELPSTEER2_WEIGHTS.get(n, 0.0) for n in ATTRIBUTES])
  np.testing.assert_allclose(got["rewards"], preds.astype(np.float64) @ weights, rtol=1e-5,
                             atol=1e-5)
  assert len(set(got["rewards"])) == 3  # distinct conversations, distinct rewards
  # The older client sends the query alone: the same reward to a relative 1e-6, not bit
  # for bit (XLA:CPU's reductions, the weighting's too, may run in another order for
  # another number of rows).
  alone = http.post("/get_reward", json={"query": TEXTS[:1]}).json()
  np.testing.assert_allclose(alone["rewards"], got["rewards"][:1], rtol=1e-6, atol=0)
  # What a SteerLM actor's sequences decode to (special tokens kept, left padding): the
  # generation prompt with its label, the answer, its end of turn, then EOS and padding.
  policy = hf.load_tokenizer(str(server.models / "policy"))
  decoded = [f"{policy.pad_token * i}{policy.bos_token}"
             f"{template.generation_prompt(conv, {'verbosity': i})}{conv.turns[-1].text}"
             f"\n{template.TURN_START}{policy.eos_token}" for i, conv in enumerate(_convs())]
  as_decoded = http.post("/get_reward", json={"query": decoded, "prompts": prompts,
                                              "labels": [None] * 3}).json()
  np.testing.assert_allclose(as_decoded["rewards"], got["rewards"], rtol=1e-6, atol=1e-6)
  assert server.stats()["compiles"] == server.warm_compiles


def test_classify_takes_verls_body_in_vllms_shape(server, http, reference):
  preds, want = reference
  tokenizer = hf.load_tokenizer(str(server.models / "rm"))
  tok = RegressionTokenizer(tokenizer, SCORER_MAX_LEN)
  for i, (text, conv) in enumerate(zip(TEXTS, _convs())):
    # verl's compute_score_disrm, one conversation per request.
    output = http.post("/classify", json={"model": "tiny", "input": text,
                                          "activation": False}).json()
    assert sorted(output) == ["created", "data", "id", "model", "object", "usage"], output
    assert output["id"].startswith("classify-") and output["object"] == "list"
    assert isinstance(output["created"], int) and output["model"] == "tiny"
    (item,) = output["data"]
    assert sorted(item) == ["index", "label", "num_classes", "probs"]
    assert item["index"] == 0 and item["num_classes"] == len(ATTRIBUTES) + 1 == 10
    assert output["data"][-1]["probs"][-1] == pytest.approx(want[i], rel=1e-6, abs=1e-6)
    np.testing.assert_allclose(item["probs"][:-1], preds[i], rtol=1e-6, atol=1e-6)
    assert item["label"] == ATTRIBUTES[int(np.argmax(preds[i]))]
    assert output["usage"] == {"prompt_tokens": len(tok.ids(conv)),
                               "total_tokens": len(tok.ids(conv)), "completion_tokens": 0,
                               "prompt_tokens_details": None}
  # A list of texts, in vLLM 0.11.2's spelling of the options.
  batch = http.post("/classify", json={"model": "tiny", "input": TEXTS,
                                       "use_activation": False,
                                       "add_special_tokens": False}).json()
  assert [d["index"] for d in batch["data"]] == [0, 1, 2]
  np.testing.assert_allclose([d["probs"][-1] for d in batch["data"]], want, rtol=1e-6,
                             atol=1e-6)
  assert server.stats()["compiles"] == server.warm_compiles


@needs_torch
def test_served_rewards_equal_transformers_on_the_attribute_model(server, http):
  """The served attribute model is an HF backbone directory with a head file: transformers'
  forward of that directory, read at the last input token (`<extra_id_2>`) and put through
  the head (kernel, bias) in NumPy, gives the served predictions and rewards."""
  import transformers
  model = transformers.AutoModel.from_pretrained(str(server.models / "rm"),
                                                 torch_dtype=torch.float32).eval()
  head = np.load(server.models / "head.npz")
  tok = RegressionTokenizer(hf.load_tokenizer(str(server.models / "rm")), SCORER_MAX_LEN)
  want = []
  for conv in _convs():
    with torch.no_grad():
      hidden = model(input_ids=torch.tensor(tok.ids(conv))[None]).last_hidden_state
    want.append(hidden[0, -1].numpy().astype(np.float64) @ head["kernel"] + head["bias"])
  want = np.asarray(want)
  got = http.post("/get_reward", json={"query": TEXTS}).json()
  np.testing.assert_allclose(np.asarray([got["extra_logs"][n] for n in ATTRIBUTES]).T, want,
                             rtol=1e-4, atol=1e-4)
  weights = rewards.weight_vector(config_sections.HELPSTEER2_WEIGHTS)
  np.testing.assert_allclose(got["rewards"], want @ weights, rtol=1e-4, atol=1e-4)
  probs = [d["probs"] for d in http.post("/classify", json={"input": TEXTS}).json()["data"]]
  np.testing.assert_allclose(probs, np.concatenate([want, (want @ weights)[:, None]], 1),
                             rtol=1e-4, atol=1e-4)


LONG = template.regression_text(protocol.scored_conversation(
    [protocol.Message(role="user", content="count")], " ".join(["w"] * 2 * SCORER_MAX_LEN)))


@pytest.mark.parametrize("path,body,param,needle", [
    ("/get_reward", {"query": ["<|im_start|>user\nhi<|im_end|>"]}, "query.0",
     "not a SteerLM chat"),
    ("/get_reward", {"query": [TEXTS[0], TEXTS[1][:TEXTS[1].rindex("<extra_id_1>Assistant")]]},
     "query.1", "ending in an assistant turn"),
    ("/get_reward", {"query": TEXTS, "prompts": ["a"]}, "prompts", "one per query (3)"),
    ("/get_reward", {"query": TEXTS[:1], "labels": ["a", "b"]}, "labels", "one per query"),
    ("/get_reward", {"query": []}, "query", "at least 1"),
    ("/get_reward", {"query": TEXTS[0]}, "query", "valid list"),
    ("/get_reward", {"query": TEXTS, "datasources": ["x"] * 3}, "datasources",
     "unrecognized request argument"),
    ("/get_reward", {"query": [TEXTS[0], LONG]}, "query.1", "too long"),
    ("/classify", {"model": "tiny", "input": []}, "input", "non-empty list"),
    ("/classify", {"model": "tiny", "input": [[1, 2, 3]]}, "input", "no token ids"),
    ("/classify", {"model": "tiny", "input": "not one"}, "input", "not a SteerLM chat"),
    ("/classify", {"model": "tiny", "input": [TEXTS[0], "not one"]}, "input.1",
     "not a SteerLM chat"),
    ("/classify", {"model": "tiny", "input": TEXTS[0], "activation": True}, "activation",
     "not class logits"),
    ("/classify", {"model": "other", "input": TEXTS[0]}, "model", "does not exist"),
    ("/classify", {"model": "tiny", "input": TEXTS[0], "truncate_prompt_tokens": 8},
     "truncate_prompt_tokens", "unrecognized request argument"),
])
def test_bad_bodies_get_400_and_the_server_keeps_serving(http, path, body, param, needle):
  response = http.post(path, json=body)
  assert response.status_code == 400, response.text
  error = response.json()["error"]
  assert error["param"] == param and needle in error["message"], error
  assert error["type"] == "invalid_request_error"
  if "too long" in needle:
    assert error["code"] == "context_length_exceeded"
  assert http.post(path, json={"input": TEXTS[0]} if path == "/classify"
                   else {"query": TEXTS[:1]}).status_code == 200


def test_key_content_type_and_size_as_on_every_route(server):
  for path, body in (("/get_reward", {"query": TEXTS}), ("/classify", {"input": TEXTS})):
    plain = httpx.post(f"{server.base}{path}", json=body)  # the frameworks' headers
    assert plain.status_code == 401 and plain.json()["error"]["code"] == "invalid_api_key"
    as_text = httpx.post(f"{server.base}{path}", content=b"{}",
                         headers={**AUTH, "Content-Type": "text/plain"})
    assert as_text.status_code == 415
    big = httpx.post(f"{server.base}{path}", content=b"[" * (2 << 20), headers=AUTH)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
