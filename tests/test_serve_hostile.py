"""The server under hostile input, disconnects, oversized requests and shutdown.

Raw HTTP through httpx on one keep-alive connection (what a client's next
request rides on after an error), the `openai` client where its exception
types are the reference, real signals, and hypothesis for bodies no one
wrote by hand. The session's server (tiny random model, one device, rows of 2,048
tokens; tests/conftest.py) serves every test but the last, which starts one of its own
with `drain_seconds=0` (a SIGTERM ends what is in flight at once) and stops it.
"""

import json
import signal
import threading
import time

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpsteer_jax.data import template
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.serve import guard, protocol
from helpsteer_jax.tasks import serve as serve_task

from serve_utils import KEY, MAX_LENGTH, MAX_TOKENS, own_server, serve_config

LONG = MAX_TOKENS  # tokens: long enough a generation to go away from, or to stop, in the middle

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2}
ITEM = {"messages": [{"role": "user", "content": "Hi."}], "response": "Hello."}
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
TEXT = template.regression_text(protocol.scored_conversation(
    [protocol.Message(**m) for m in ITEM["messages"]], ITEM["response"]))


@pytest.fixture(scope="module")
def schemas(server) -> dict:
  """The server's /openapi.json components, for jsonschema (`{"$ref": ...}` + these)."""
  return {"components": httpx.get(f"{server.base}/openapi.json").json()["components"]}


def _valid(instance, name: str, schemas: dict) -> None:
  jsonschema.validate(instance, {"$ref": f"#/components/schemas/{name}", **schemas})


@pytest.fixture()
def http(server):
  with httpx.Client(base_url=server.base, headers=AUTH, timeout=120) as client:
    yield client


def _error(response, status: int) -> dict:
  assert response.status_code == status, response.text
  assert response.headers["content-type"] == "application/json"
  return response.json()["error"]


@pytest.mark.parametrize("path,raw,param,needle", [
    ("chat/completions", '{"model": "tiny", "messages": [], "max_tokens": 1' + "0" * 5000 + "}",
     None, "not valid JSON"),
    ("chat/completions", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", None, "nested"),
    ("chat/completions", json.dumps({**CHAT, "messages": [
        {"role": "user", "content": "a\ud800b"}]}), "messages.0.content", "lone surrogate"),
    ("rewards", json.dumps({"items": [{**ITEM, "response": "a\udfffb"}]}),
     "items.0.response", "lone surrogate"),
    ("rewards", json.dumps({"texts": ["x\ud800"]}), "texts.0", "lone surrogate"),
    ("rewards", '{"items": [' + json.dumps(ITEM) + '], "weights": {"helpfulness": Infinity}}',
     "weights.helpfulness", "finite"),
    ("rewards", '{"items": [' + json.dumps(ITEM) + '], "weights": {"helpfulness": NaN}}',
     "weights.helpfulness", "finite"),
    ("rewards", json.dumps({"model": "other", "items": [ITEM]}), "model", "does not exist"),
    ("chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}],'
     ' "temperature": NaN}', "temperature", "finite"),
    ("chat/completions", json.dumps({**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]}), "messages.0.content",
     "text only"),
])
def test_hostile_bodies_get_400_and_the_connection_stays_usable(http, path, raw, param,
                                                                 needle):
  e = _error(http.post(f"/v1/{path}", content=raw.encode("utf-8", "surrogatepass")), 400)
  assert needle in e["message"] and e["param"] == param, e
  assert http.get("/v1/models").status_code == 200  # the same connection


def test_finite_weights_whose_reward_overflows_get_400(http):
  predictions = http.post("/v1/rewards", json={"items": [ITEM]}).json()["data"][0]
  name, value = max(predictions["attributes"].items(), key=lambda kv: abs(kv[1]))
  assert abs(value) > 1.1  # the fixed random head's largest prediction
  weight = 1.7e308 if value > 0 else -1.7e308  # finite; its product is past float64's range
  e = _error(http.post("/v1/rewards", json={"items": [ITEM], "weights": {name: weight}}), 400)
  assert e["param"] == "weights" and "overflows" in e["message"]


def test_size_limit_content_type_host_and_bearer(server, http):
  limit = serve_task.request_bytes(0, MAX_LENGTH)
  assert limit == 1 << 20
  big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * limit}]})
  assert _error(http.post("/v1/chat/completions", content=big), 413)["code"] == (
      "request_too_large")

  def chunks():  # no Content-Length: counted as it arrives
    for _ in range(3):
      yield b" " * (limit // 2)
  e = _error(httpx.post(f"{server.base}/v1/chat/completions", content=chunks(), headers=AUTH),
             413)
  assert str(limit) in e["message"]

  plain = {**AUTH, "Content-Type": "text/plain"}
  assert _error(http.post("/v1/chat/completions", content=json.dumps(CHAT), headers=plain),
                415)["code"] == "unsupported_media_type"
  e = _error(http.get("/v1/models", headers={"Host": "attacker.example"}), 400)
  assert e["code"] == "invalid_host" and "127.0.0.1" in e["message"]
  assert http.get("/stats", headers={"Host": f"localhost:{server.port}"}).status_code == 200
  lower = {**AUTH, "Authorization": f"bearer {KEY}"}
  assert http.post("/v1/chat/completions", json=CHAT, headers=lower).status_code == 200
  assert _error(http.get("/v1/models", headers={"Authorization": f"Basic {KEY}"}), 401)


def test_405_names_the_allowed_methods_and_head_answers_like_get(http):
  response = http.post("/v1/models", json={})
  _error(response, 405)
  assert response.headers["allow"] == "GET"
  assert http.request("DELETE", "/v1/chat/completions").headers["allow"] == "POST"
  for path in ("/", "/v1/models", "/stats", "/playground/config"):
    got, head = http.get(path), http.head(path)
    assert head.status_code == got.status_code == 200, path
    assert head.content == b"" and head.headers["content-length"] == str(len(got.content))


def test_a_large_prompt_is_tokenized_off_the_event_loop(server, http):
  # Close to the size limit: its tokenization takes about a second here, during which
  # other requests are answered (before, they waited for it).
  words = " ".join(f"word{i % 97}" for i in range(110_000))
  body = {**CHAT, "messages": [{"role": "user", "content": words}]}
  answers = []

  def send():
    answers.append(http.post("/v1/chat/completions", json=body))

  senders = [threading.Thread(target=send) for _ in range(2)]
  latencies = []
  with httpx.Client(base_url=server.base, headers=AUTH, timeout=60) as other:
    for t in senders:
      t.start()
    while any(t.is_alive() for t in senders):
      start = time.perf_counter()
      assert other.get("/v1/models").status_code == 200
      latencies.append(time.perf_counter() - start)
      time.sleep(0.05)
  for t in senders:
    t.join()
  assert [_error(a, 400)["code"] for a in answers] == ["context_length_exceeded"] * 2
  # Blocked, the loop answered twice in the whole time, each after a second or more.
  assert len(latencies) >= 5 and max(latencies) < 1.0, latencies


def test_a_non_streaming_client_that_goes_away_frees_its_rows(server):
  before = server.stats()
  body = {**CHAT, "max_tokens": LONG, "n": 3, "temperature": 0}
  with pytest.raises(httpx.ReadTimeout):
    httpx.post(f"{server.base}/v1/chat/completions", json=body, headers=AUTH, timeout=0.3)
  deadline = time.time() + 10
  while True:
    stats = server.stats()
    if stats["cancelled"] == before["cancelled"] + 3 and stats["busy_rows"] == 0:
      break
    assert time.time() < deadline, stats
    time.sleep(0.05)
  assert stats["generated_tokens"] - before["generated_tokens"] < 3 * LONG


BODY_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=4),
    max_leaves=12)
FIELDS = ["model", "messages", "prompt", "max_tokens", "temperature", "top_p", "n", "stop",
          "seed", "stream", "stream_options", "logprobs", "echo", "attributes",
          "chat_template_kwargs", "items", "texts", "weights", "role", "content", "query",
          "prompts", "labels", "input", "activation", "use_activation"]


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(["chat/completions", "completions", "rewards", "get_reward",
                              "classify"]),
       changes=st.dictionaries(st.sampled_from(FIELDS), BODY_VALUES, max_size=4),
       nested=st.dictionaries(st.sampled_from(FIELDS), BODY_VALUES, max_size=2))
def test_no_body_gets_a_server_error(http, schemas, route, changes, nested):
  base = {"chat/completions": CHAT, "completions": {"model": "tiny", "prompt": "Hi",
                                                   "max_tokens": 2},
          "rewards": {"items": [ITEM]}, "get_reward": {"query": [TEXT]},
          "classify": {"model": "tiny", "input": TEXT}}[route]
  body = {**base, **changes}
  if isinstance(body.get("messages"), list) and body["messages"] and isinstance(
      body["messages"][0], dict):
    body["messages"] = [{**body["messages"][0], **nested}]
  # Valid generations stay short: the property is about what is refused.
  if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 4:
    body["max_tokens"] = 4
  path = f"/{route}" if route in ("get_reward", "classify") else f"/v1/{route}"
  response = http.post(path, content=json.dumps(body, allow_nan=True))
  assert response.status_code < 500, (body, response.text)
  if response.status_code >= 400:
    _valid(response.json(), "ErrorResponse", schemas)
    assert response.json()["error"]["message"]


def test_openapi_documents_every_body_and_error(server, http, schemas):
  spec = http.get("/openapi.json").json()
  bodies = {"/v1/chat/completions": ("ChatRequest", CHAT),
            "/v1/completions": ("CompletionRequest", {"model": "tiny", "prompt": [1, 2],
                                                      "max_tokens": 2}),
            "/v1/rewards": ("RewardRequest", {"items": [ITEM], "weights": {"coherence": 1}}),
            "/get_reward": ("GetRewardRequest", {"query": [TEXT], "prompts": [""],
                                                 "labels": [None]}),
            "/classify": ("ClassifyRequest", {"model": "tiny", "input": [TEXT],
                                              "activation": False})}
  for path, (name, example) in bodies.items():
    post = spec["paths"][path]["post"]
    schema = post["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": f"#/components/schemas/{name}"}
    for status in ("400", "401", "413", "415", "503"):
      assert post["responses"][status]["content"]["application/json"]["schema"] == {
          "$ref": "#/components/schemas/ErrorResponse"}, (path, status)
    _valid(example, name, schemas)
    assert http.post(path, json=example).status_code == 200
    with pytest.raises(jsonschema.ValidationError):
      _valid({**example, "unknown_field": 1}, name, schemas)
    e = http.post(path, json={**example, "unknown_field": 1})
    assert e.status_code == 400
    _valid(e.json(), "ErrorResponse", schemas)
  for path in ("/v1/rewards", "/get_reward", "/classify"):
    assert "404" in spec["paths"][path]["post"]["responses"]
  assert "401" in spec["paths"]["/v1/models"]["get"]["responses"]
  for refusal in (http.get("/v1/models", headers={"Authorization": "Bearer wrong"}),
                  http.post("/v1/rewards", content="{}", headers={"Content-Type": "text/plain"}),
                  http.post("/v1/rewards", content=b"{" * (2 << 20))):
    assert refusal.status_code in (401, 413, 415)
    _valid(refusal.json(), "ErrorResponse", schemas)


def test_serving_beyond_loopback_needs_a_key_or_a_flag(monkeypatch):
  monkeypatch.delenv(serve_task.API_KEY_ENV, raising=False)
  config = serve_config()
  config.serve.host = "0.0.0.0"
  with pytest.raises(ConfigError, match="allow_no_key"):
    serve_task.settings(config)
  config.serve.allow_no_key = True
  assert serve_task.settings(config).allowed_hosts == frozenset(guard.LOOPBACK_HOSTS)
  config.serve.update(allow_no_key=False, api_key="k", allowed_hosts="api.example, [::1]")
  assert serve_task.settings(config).allowed_hosts == {"api.example", "::1"}
  config.serve.host = "10.0.0.5"
  config.serve.allowed_hosts = ""
  assert "10.0.0.5" in serve_task.settings(config).allowed_hosts
  config.serve.allowed_hosts = "*"
  assert serve_task.settings(config).allowed_hosts is None
  assert [guard.host_name(h) for h in ("[::1]:8000", "LocalHost:80", "::1", "a.b")] == [
      "::1", "localhost", "::1", "a.b"]


def test_sigterm_past_the_drain_time_ends_every_request_with_an_error(served_models, tmp_path):
  server = own_server(served_models, tmp_path, "--config.serve.drain_seconds=0")
  try:
    _sigterm_past_the_drain_time(server)
  finally:
    server.stop()


def _sigterm_past_the_drain_time(server):
  events, answers, started = [], [], threading.Event()

  def stream():
    body = {**CHAT, "max_tokens": LONG, "n": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.base}/v1/chat/completions", json=body, headers=AUTH,
                      timeout=120) as response:
      for line in response.iter_lines():
        if line.startswith("data: "):
          events.append(line[len("data: "):])
          started.set()

  def plain():
    body = {**CHAT, "max_tokens": LONG, "temperature": 0}
    answers.append(httpx.post(f"{server.base}/v1/chat/completions", json=body,
                              headers=AUTH, timeout=120))

  # Three streamed rows and one plain one fill the four rows; one more plain request waits.
  threads = [threading.Thread(target=stream)] + [threading.Thread(target=plain) for _ in "ab"]
  for t in threads:
    t.start()
  assert started.wait(60)
  deadline = time.time() + 30
  while server.stats()["busy_rows"] < 4 or server.stats()["waiting"] < 1:
    assert time.time() < deadline, server.stats()
  server.proc.send_signal(signal.SIGTERM)
  for t in threads:
    t.join(60)
  assert events[-1] == "[DONE]"
  error = json.loads(events[-2])["error"]
  assert error["code"] == "shutting_down" and "drain time" in error["message"]
  assert [_error(a, 503)["code"] for a in answers] == ["shutting_down"] * 2
  assert server.proc.wait(60) == 0, server.output()
