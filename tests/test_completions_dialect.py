"""`/v1/completions` in the dialect outside clients speak (OpenAI's legacy API, vLLM's
behaviour where OpenAI's is silent): prompt forms, echo, logprobs, max_tokens=0.

References: the tokenizer itself (a string prompt's ids), the model loaded in this
process (a NumPy log_softmax of its full forward's logits), single-prompt requests
(a batch's choices) and the official `openai` client. The session's server (tiny random
fp32 model, demo tokenizer; tests/conftest.py) serves every test.
"""

import collections
import json

import numpy as np
import pytest

from helpsteer_jax.models import hf

from serve_utils import MAX_LENGTH
from tolerances import BATCH_ATOL

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def reference(server):
  """The policy's tokenizer and its NumPy log-probabilities of a token sequence."""
  tokenizer = hf.load_tokenizer(str(server.models / "policy"))
  model = hf.load_hf_model(server.models / "policy")

  def logprobs(ids: list[int]) -> np.ndarray:
    """[len(ids), vocab]: row p is the distribution of token p + 1."""
    tokens = np.asarray([ids], np.int32)
    x = np.asarray(model.logits(model(tokens)))[0].astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))

  return tokenizer, logprobs


def _complete(server, **body) -> dict:
  response = server.post("completions", {"model": "tiny", **body})
  assert response.status_code == 200, response.text
  return response.json()


def _check_logprobs(lp: dict, ids: list[int], rows: np.ndarray, k: int, tokenizer) -> None:
  """A legacy `logprobs` object of `ids` against reference rows [len(ids), vocab]."""
  assert lp["tokens"] == [tokenizer.decode([t]) for t in ids]
  # The engine's batch against one full forward: not bitwise (tests/tolerances.py).
  np.testing.assert_allclose(lp["token_logprobs"], rows[np.arange(len(ids)), ids], rtol=0,
                             atol=BATCH_ATOL)
  for t, top, row in zip(ids, lp["top_logprobs"], rows):
    best = np.argsort(-row)[:k]
    want = {tokenizer.decode([int(i)]): row[i] for i in best}
    want.setdefault(tokenizer.decode([t]), row[t])  # the token itself, when not among them
    assert top.keys() == want.keys()
    np.testing.assert_allclose([top[s] for s in want], list(want.values()), rtol=0,
                               atol=BATCH_ATOL)
  offsets = np.cumsum([0] + [len(s) for s in lp["tokens"]])[:-1]
  assert lp["text_offset"] == offsets.tolist()


def test_prompt_forms_batch_numbering_and_usage(server, reference):
  tokenizer, _ = reference
  ids = tokenizer(PROMPT)["input_ids"]  # as the tokenizer encodes it: no BOS added
  single = _complete(server, prompt=PROMPT, max_tokens=8, temperature=0)
  assert single["usage"]["prompt_tokens"] == len(ids)
  for same in ({"prompt": ids}, {"prompt": [ids]}, {"prompt": [PROMPT]}):
    again = _complete(server, max_tokens=8, temperature=0, **same)
    assert again["choices"][0]["text"] == single["choices"][0]["text"]
    assert again["usage"] == single["usage"]
  other = "The castle"
  alone = _complete(server, prompt=other, max_tokens=8, temperature=0)
  batch = _complete(server, prompt=[PROMPT, tokenizer(other)["input_ids"]], max_tokens=8,
                    temperature=0, n=2)
  # Prompt i's sample j is choice i * n + j.
  assert [c["index"] for c in batch["choices"]] == [0, 1, 2, 3]
  texts = [c["text"] for c in batch["choices"]]
  assert texts == [single["choices"][0]["text"]] * 2 + [alone["choices"][0]["text"]] * 2
  usage = batch["usage"]
  assert usage["prompt_tokens"] == len(ids) + alone["usage"]["prompt_tokens"]
  assert usage["completion_tokens"] == 2 * (single["usage"]["completion_tokens"]
                                            + alone["usage"]["completion_tokens"])


def test_generated_logprobs_are_the_models_raw_ones(server, reference):
  tokenizer, logprobs = reference
  ids = tokenizer(PROMPT)["input_ids"]
  by_text = collections.defaultdict(list)
  for i in range(len(tokenizer)):
    by_text[tokenizer.decode([i])].append(i)
  # Sampled at temperature 1.5: the log-probabilities are still the model's own.
  for settings in ({"temperature": 0}, {"temperature": 1.5, "top_p": 0.9, "seed": 3}):
    out = _complete(server, prompt=PROMPT, max_tokens=10, logprobs=3, **settings)
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == out["usage"]["completion_tokens"] >= 1
    # The completion's ids: of the ids with each named token's text, the one the model
    # gives that log-probability (a text may name several ids, e.g. partial characters).
    new = []
    for text, got in zip(lp["tokens"], lp["token_logprobs"]):
      row = logprobs(ids + new)[-1]
      new.append(min(by_text[text], key=lambda i: abs(row[i] - got)))
    rows = logprobs(ids + new)[len(ids) - 1:-1]
    _check_logprobs(lp, new, rows, 3, tokenizer)
    if settings["temperature"] == 0:
      assert all(max(top.values()) == t for top, t in zip(lp["top_logprobs"],
                                                         lp["token_logprobs"]))


def test_echo_with_max_tokens_0_scores_the_prompt(server, reference):
  tokenizer, logprobs = reference
  ids = tokenizer(PROMPT)["input_ids"]
  out = _complete(server, prompt=ids, max_tokens=0, echo=True, logprobs=5)
  choice = out["choices"][0]
  assert choice["text"] == tokenizer.decode(ids) and choice["finish_reason"] == "length"
  assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0,
                          "total_tokens": len(ids)}
  lp = choice["logprobs"]
  assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
  rows = logprobs(ids)[:-1]
  rest = {k: v[1:] for k, v in lp.items()}
  rest["text_offset"] = [o - len(lp["tokens"][0]) for o in rest["text_offset"]]
  _check_logprobs(rest, ids[1:], rows, 5, tokenizer)
  # With generated tokens after the prompt (lm-evaluation-harness' loglikelihood request).
  both = _complete(server, prompt=[ids], max_tokens=1, echo=True, logprobs=1, temperature=0)
  lp2 = both["choices"][0]["logprobs"]
  assert len(lp2["tokens"]) == len(ids) + 1
  np.testing.assert_allclose(lp2["token_logprobs"][1:-1], lp["token_logprobs"][1:],
                             atol=1e-6)
  assert both["choices"][0]["text"].startswith(tokenizer.decode(ids))
  # The official client.
  client = server.client()
  result = client.completions.create(model="tiny", prompt=PROMPT, logprobs=5, echo=True,
                                     max_tokens=0)
  assert result.choices[0].text == PROMPT
  np.testing.assert_allclose(result.choices[0].logprobs.token_logprobs[1:],
                             lp["token_logprobs"][1:], atol=1e-6)


def test_echo_streams_the_prompt_first(server):
  whole = _complete(server, prompt=PROMPT, max_tokens=6, temperature=0, echo=True)
  client = server.client()
  chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6,
                                          temperature=0, echo=True, stream=True))
  assert chunks[0].choices[0].text == PROMPT
  assert "".join(c.choices[0].text for c in chunks if c.choices) == whole["choices"][0]["text"]
  only = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=0,
                                        echo=True, stream=True))
  assert [(c.choices[0].text, c.choices[0].finish_reason) for c in only] == [
      (PROMPT, None), ("", "length")]


@pytest.mark.parametrize("body,param,needle", [
    ({"prompt": ""}, "prompt", "prompt: the prompt is empty"),
    ({"prompt": []}, "prompt", "a list of lists of token ids"),
    ({"prompt": [[]]}, "prompt", "the prompt is empty"),
    ({"prompt": ["a", ""]}, "prompt", "prompt[1]: the prompt is empty"),
    ({"prompt": [5, 1024]}, "prompt", "token id 1024 is out of the vocabulary (0..1023)"),
    ({"prompt": [[1], [-1]]}, "prompt", "prompt[1]: token id -1"),
    ({"prompt": [1, "a"]}, "prompt", "give a string, a list of strings"),
    ({"prompt": 7}, "prompt", "not int"),
    ({"prompt": "x" * 3 * MAX_LENGTH}, "prompt", f"context length is {MAX_LENGTH}"),
    ({"max_tokens": 0}, "max_tokens", "give echo=true"),
    ({"max_tokens": -1, "echo": True}, "max_tokens", "greater than or equal to 0"),
    ({"logprobs": 21}, "logprobs", "less than or equal to 20"),
    ({"logprobs": 1, "stream": True}, "logprobs", "logprobs with stream is not supported"),
    ({"suffix": "x"}, "suffix", "unrecognized request argument"),
])
def test_bad_completions_get_400_naming_the_field(server, body, param, needle):
  response = server.post("completions", {"model": "tiny", "prompt": PROMPT, **body})
  assert response.status_code == 400, response.text
  error = response.json()["error"]
  assert needle in error["message"] and error["param"] == param, error
  assert error["type"] == "invalid_request_error"


def test_no_compilation_after_warm_up(server):
  # Every prompt bucket's scoring was compiled at warm-up.
  for words in (1, 30, 120):
    _complete(server, prompt="tell " * words, max_tokens=0, echo=True, logprobs=2)
  _complete(server, prompt=[PROMPT, "x"], max_tokens=3, echo=True, logprobs=1, n=2,
            temperature=0.8)
  stats = server.stats()
  assert stats["compiles"] == server.warm_compiles, json.dumps(stats)
