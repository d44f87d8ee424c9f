"""The OpenAI-compatible server, run as `python -m helpsteer_jax.main` on loopback.

References: the official `openai` client (request and response shapes,
errors as its exception types), raw HTTP through httpx for what the client
hides (the SSE stream's `data: [DONE]`, malformed JSON), configs/generate.py's
output for greedy text, data/template.py for the rendered prompt, and the
annotate path (scoring.load.load_scorer in this process) for rewards. The session's
server (tiny random model, demo tokenizer, one device; tests/conftest.py) serves every
test but the SIGTERM one, which starts a server of its own.
"""

import json
import os
import re
import signal
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from helpsteer_jax import config_sections
from helpsteer_jax.config_sections import scorer_section
from helpsteer_jax.data import template
from helpsteer_jax.data.features import tokenize
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import steering
from helpsteer_jax.models import hf
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.scoring import rewards
from helpsteer_jax.scoring.load import load_scorer

from cli_utils import run_main
from conftest import REPO_ROOT
from serve_utils import KEY, MAX_LENGTH, MAX_TOKENS, SCORER_MAX_LEN, own_server, serve_config

QUESTION = "What is 2 plus 3?"


def _chat(client, content=QUESTION, **kw):
  return client.chat.completions.create(
      model="tiny", messages=[{"role": "user", "content": content}], **kw)


def test_models_chat_and_steering(server):
  client = server.client()
  assert [m.id for m in client.models.list().data] == ["tiny"]
  tokenizer = hf.load_tokenizer(str(server.models / "policy"))

  def prompt_tokens(conv, attributes):
    text = template.generation_prompt(conv, {**steering.run_attributes(serve_config()),
                                             **attributes})
    return len(tokenize.tokenize_pieces([template.Piece(text, False)], tokenizer).ids)

  as_dict = _chat(client, max_tokens=12, temperature=0, extra_body={"attributes": {
      "verbosity": 1, "humor": 3}})
  as_label = _chat(client, max_tokens=12, temperature=0,
                   extra_body={"attributes": "verbosity:1,humor:3"})
  # vLLM's and SGLang's spelling of template variables steers the same way.
  as_kwargs = _chat(client, max_tokens=12, temperature=0, extra_body={
      "chat_template_kwargs": {"attributes": {"verbosity": 1, "humor": 3}}})
  assert as_kwargs.choices[0].message.content == as_dict.choices[0].message.content
  assert as_kwargs.usage == as_dict.usage
  assert as_dict.object == "chat.completion" and as_dict.model == "tiny"
  assert as_dict.choices[0].message.role == "assistant"
  assert as_dict.choices[0].message.content == as_label.choices[0].message.content
  assert as_dict.choices[0].finish_reason in ("stop", "length")
  conv = Conversation(template.DEFAULT_SYSTEM, (Turn("User", QUESTION),), mask_role="User")
  usage = as_dict.usage
  assert usage.prompt_tokens == prompt_tokens(conv, {"verbosity": 1, "humor": 3})
  assert usage.completion_tokens <= 12
  assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
  # A system message replaces the default system; earlier assistant turns carry
  # this request's label, as AC-SFT data does.
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
              {"role": "assistant", "content": "hello"}, {"role": "user", "content": QUESTION}]
  multi = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                         temperature=0, extra_body={"attributes": {
                                             "verbosity": 0}})
  label = template.label_string({**steering.run_attributes(serve_config()), "verbosity": 0})
  conv = Conversation("Be brief.", (Turn("User", "hi"), Turn("Assistant", "hello", label),
                                    Turn("User", QUESTION)), mask_role="User")
  assert multi.usage.prompt_tokens == prompt_tokens(conv, {"verbosity": 0})


def test_greedy_chat_equals_the_generate_task(server, tmp_path):
  requests = [("What is 2 plus 3?", {"verbosity": 1}), ("Name a colour", {"humor": 2}),
              ("Tell me about castles", {})]
  (tmp_path / "in.jsonl").write_text("".join(
      json.dumps({"prompt": p, "attributes": a}) + "\n" for p, a in requests))
  run_main("--config=configs/generate.py", f"--config.init.source={server.models / 'policy'}",
           f"--config.input={tmp_path / 'in.jsonl'}", "--config.max_new_tokens=24",
           f"--config.max_length={MAX_LENGTH}", f"--workdir={tmp_path}", devices=1)
  rows = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
  client = server.client()
  results = [None] * len(requests)

  def ask(i):  # concurrently: the rows share decode steps
    prompt, attributes = requests[i]
    results[i] = _chat(client, prompt, max_tokens=24, temperature=0,
                       extra_body={"attributes": attributes})

  threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  for row, result in zip(rows, results):
    assert result.choices[0].message.content == row["response"]
    assert result.choices[0].finish_reason == row["finish_reason"]


def test_completions_n_seed_and_streaming(server):
  client = server.client()
  kw = dict(model="tiny", prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=5)
  first = client.completions.create(n=3, **kw)
  again = client.completions.create(n=3, **kw)
  assert first.object == "text_completion" and len(first.choices) == 3
  assert [c.index for c in first.choices] == [0, 1, 2]
  assert [c.text for c in first.choices] == [c.text for c in again.choices]
  assert len({c.text for c in first.choices}) > 1  # each choice its own seed
  assert 3 <= first.usage.completion_tokens <= 48
  # The stream's pieces join to the same texts; usage comes last, then [DONE].
  stream = client.completions.create(n=3, stream=True, stream_options={"include_usage": True},
                                     **kw)
  texts, finishes, usage = ["", "", ""], [None] * 3, None
  for chunk in stream:
    for c in chunk.choices:
      texts[c.index] += c.text
      finishes[c.index] = c.finish_reason or finishes[c.index]
    usage = chunk.usage or usage
  assert texts == [c.text for c in first.choices]
  assert finishes == [c.finish_reason for c in first.choices]
  assert usage.completion_tokens == first.usage.completion_tokens
  chat_kw = dict(max_tokens=20, temperature=0.7, seed=1)
  whole = _chat(client, **chat_kw).choices[0].message.content
  pieces = [c.choices[0].delta.content or "" for c in _chat(client, stream=True, **chat_kw)]
  assert "".join(pieces) == whole
  raw = server.post("chat/completions", {"model": "tiny", "stream": True, "max_tokens": 3,
                                         "messages": [{"role": "user", "content": "hi"}]})
  events = [e for e in raw.text.split("\n\n") if e]
  assert raw.headers["content-type"].startswith("text/event-stream")
  assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
  assert json.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant"


@pytest.mark.parametrize("body,param,needle", [
    ({"attributes": {"wit": 1}}, "attributes", "unknown attribute"),
    ({"attributes": {"verbosity": 5}}, "attributes", "outside 0..4"),
    ({"attributes": "verbosity=1"}, "attributes", "malformed label"),
    ({"chat_template_kwargs": {"attributes": {"verbosity": 5}}},
     "chat_template_kwargs.attributes", "outside 0..4"),
    ({"chat_template_kwargs": {"attributes": 3}}, "chat_template_kwargs.attributes",
     "an object or a label string"),
    ({"chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs.enable_thinking",
     "takes only 'attributes'"),
    ({"attributes": {"verbosity": 1}, "chat_template_kwargs": {"attributes": {"verbosity": 1}}},
     "attributes", "not both"),
    ({"model": "gpt-4"}, "model", "does not exist"),
    ({"n": 4}, "n", "limit 3"),
    ({"max_tokens": MAX_TOKENS + 1}, "max_tokens", f"limit {MAX_TOKENS}"),
    ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"temperature": 3}, "temperature", "less than or equal to 2"),
    ({"messages": [{"role": "user", "content": "word " * (MAX_LENGTH + 100)}]}, "messages",
     f"context length is {MAX_LENGTH}"),
    ({"messages": [{"role": "user", "content": "word " * (MAX_LENGTH - MAX_TOKENS)}],
      "max_tokens": MAX_TOKENS}, "max_tokens", f"context length {MAX_LENGTH}"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "messages", "the user's"),
    ({"messages": []}, "messages", "at least 1"),
    ({"logit_bias": {"1": 2}}, "logit_bias", "unrecognized request argument"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "up to 4"),
])
def test_bad_requests_get_400_and_the_server_keeps_serving(server, body, param, needle):
  with pytest.raises(openai.BadRequestError) as err:
    _chat(server.client(), extra_body=body)  # the body's fields replace the valid ones
  assert err.value.status_code == 400
  assert needle in err.value.body["message"] and err.value.body["param"] == param
  assert err.value.body["type"] == "invalid_request_error"
  assert _chat(server.client(), max_tokens=2).choices[0].finish_reason in ("stop", "length")


def test_malformed_json_and_api_key(server):
  for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
    response = server.post("chat/completions", raw)
    assert response.status_code == 400 and "error" in response.json()
  with pytest.raises(openai.AuthenticationError) as err:
    _chat(server.client(key="wrong"), max_tokens=2)
  assert err.value.status_code == 401 and err.value.body["code"] == "invalid_api_key"
  assert httpx.get(f"{server.base}/v1/models").status_code == 401
  assert _chat(server.client(), max_tokens=2).usage.completion_tokens >= 1


def test_a_client_that_disconnects_frees_its_row(server):
  before = server.stats()["cancelled"]
  stream = _chat(server.client(), max_tokens=400, temperature=0, stream=True)
  next(iter(stream))
  stream.close()
  deadline = time.time() + 60
  while not (server.stats()["cancelled"] == before + 1 and server.stats()["busy_rows"] == 0):
    assert time.time() < deadline, server.stats()
    time.sleep(0.2)


def test_warm_up_counts_programs_to_its_total_then_says_ready(server):
  lines = re.split(r"[\r\n]+", (server.root / "server.log").read_text())
  bars = [(i, int(m[1]), int(m[2])) for i, line in enumerate(lines)
          if (m := re.search(r"serve: warm-up: .*?(\d+)/(\d+) \[[^]]*program", line))]
  assert len(bars) >= 2, lines[:40]  # the empty bar, then at least its end
  counts = [count for _, count, _ in bars]
  totals = {total for _, _, total in bars}
  assert len(totals) == 1 and counts == sorted(counts), bars
  assert counts[0] < counts[-1] == totals.pop(), bars
  ready = [i for i, line in enumerate(lines)
           if line.startswith(f"serve: tiny ready: API {server.base}/v1, playground"
                              f" {server.base}/ (warmed up in")]
  assert len(ready) == 1 and ready[0] > bars[-1][0], lines


def test_no_compilation_after_warm_up(server):
  client = server.client()
  _chat(client, "a much longer prompt " * 3, max_tokens=30, temperature=0.9, top_p=0.8, n=2)
  client.completions.create(model="tiny", prompt="x", max_tokens=5, temperature=0)
  stats = server.stats()
  assert stats["compiles"] == server.warm_compiles, stats
  assert stats["requests"] > 0


def test_rewards_of_many_lengths_compile_nothing_after_warm_up(server):
  # Scoring pads to fixed length buckets, all compiled at warm-up: inputs of 46 to 454
  # tokens (every bucket of max_len 512) in batches of 1 to 3 items.
  lengths = []
  for words in (1, 9, 20, 40, 90, 130):
    item = {"messages": [{"role": "user", "content": "count"}],
            "response": " ".join(f"w{i}" for i in range(words))}
    response = server.post("rewards", {"items": [item] * (1 + words % 3)})
    assert response.status_code == 200, response.text
    assert response.json()["data"][0]["attributes"] is not None
    lengths.append(words)
  stats = server.stats()
  assert stats["compiles"] == server.warm_compiles, (stats, lengths)


def _annotate_config(server):
  """configs/annotate.py on the server's attribute model (backbone + head file)."""
  import runpy
  config = runpy.run_path(str(REPO_ROOT / "configs" / "annotate.py"))["get_config"]()
  config.unlock()
  config.scorer.source = str(server.models / "rm")
  config.scorer.head = str(server.models / "head.npz")
  config.scorer.max_len = SCORER_MAX_LEN
  config.data.max_rows = 6
  return config


def test_rewards_match_annotate_scoring_and_the_http_scorer(server, tmp_path):
  items = [([{"role": "user", "content": QUESTION}], "It is 5."),
           ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}],
            "Goodbye!")]
  response = server.post("rewards", {"items": [{"messages": m, "response": r}
                                               for m, r in items]})
  assert response.status_code == 200, response.text
  data = response.json()["data"]
  got = np.asarray([[row["attributes"][n] for n in ATTRIBUTES] for row in data])
  # The annotate path in this process, on the same attribute model.
  config = _annotate_config(server)
  setup = setup_lib.prepare(config, tmp_path / "ref", tokenizer=False, model=False)
  scorer = load_scorer(config.scorer, setup.rt)
  from helpsteer_jax.serve import protocol
  convs = [protocol.scored_conversation([protocol.Message(**x) for x in m], r)
           for m, r in items]
  want = scorer(convs)
  assert not np.isnan(want).any()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  weights = rewards.weight_vector(config_sections.HELPSTEER2_WEIGHTS)
  np.testing.assert_allclose([row["reward"] for row in data], want @ weights, rtol=1e-4,
                             atol=1e-4)
  custom = server.post("rewards", {"items": [{"messages": items[0][0], "response": "x"}],
                                   "weights": {"verbosity": 1.0}}).json()["data"][0]
  assert custom["reward"] == pytest.approx(custom["attributes"]["verbosity"], abs=1e-6)
  # The http scorer sends the conversations as items; the attribute model's input texts
  # (`texts`) score the same.
  os.environ["HELPSTEER_API_KEY"] = KEY
  try:
    remote = load_scorer(scorer_section(source=f"{server.base}/v1"), None)
    np.testing.assert_allclose(remote(convs), got, rtol=1e-6)
  finally:
    del os.environ["HELPSTEER_API_KEY"]
  by_text = server.post("rewards", {"texts": [template.regression_text(c) for c in convs]})
  assert by_text.status_code == 200, by_text.text
  np.testing.assert_allclose([[row["attributes"][n] for n in ATTRIBUTES]
                              for row in by_text.json()["data"]], got, rtol=1e-6)
  bad = server.post("rewards", {"texts": ["no marker"]})
  assert bad.status_code == 400 and "attribute-model input" in bad.json()["error"]["message"]
  assert server.post("rewards", {"items": [], "weights": {"wit": 1}}).status_code == 400


def test_annotate_through_the_server_equals_annotate_in_process(server, tmp_path):
  # Reference: the annotate task scoring with the attribute model itself.
  from helpsteer_jax.tasks import annotate
  local = annotate.run(_annotate_config(server), str(tmp_path / "local"))
  config = _annotate_config(server)
  config.scorer.source = f"{server.base}/v1"
  config.scorer.batch_size = 4  # several requests per chunk
  os.environ["HELPSTEER_API_KEY"] = KEY
  try:
    remote = annotate.run(config, str(tmp_path / "remote"))
  finally:
    del os.environ["HELPSTEER_API_KEY"]
  assert remote["written"] == local["written"] == 6 and remote["turns"] > 0
  assert ((tmp_path / "remote" / "annotated.jsonl").read_text()
          == (tmp_path / "local" / "annotated.jsonl").read_text())
  config.scorer.source = "127.0.0.1:1"
  with pytest.raises(ConfigError, match="base URL"):
    annotate.run(config, str(tmp_path / "bad"))


def test_sigterm_drains_in_flight_requests_and_exits_0(served_models, tmp_path):
  server = own_server(served_models, tmp_path)
  try:
    client = server.client()
    result, streaming = {}, threading.Event()

    def ask():
      # Streamed, so that the signal provably lands after the rows started.
      stream = _chat(client, max_tokens=300, temperature=0, n=3, stream=True,
                     stream_options={"include_usage": True})
      finished = {}
      for chunk in stream:
        streaming.set()
        for c in chunk.choices:
          if c.finish_reason:
            finished[c.index] = c.finish_reason
        result["usage"] = chunk.usage or result.get("usage")
      result["finished"] = finished

    thread = threading.Thread(target=ask)
    thread.start()
    assert streaming.wait(60)
    server.proc.send_signal(signal.SIGTERM)
    thread.join(120)
    assert sorted(result["finished"]) == [0, 1, 2]
    assert result["usage"].completion_tokens >= 3
    assert server.proc.wait(120) == 0, server.output()
    assert "serve: stopped after" in server.output()
    with pytest.raises(httpx.TransportError):
      server.stats()
  finally:
    server.stop()
