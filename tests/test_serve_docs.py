"""docs/tasks/serve.md's reward requests, run as written against a server started as the
guide starts it (its `--config.*` flags, the serve tests' tiny policy for `workdir/acsft`,
no API key): each curl body gets the answer shown after it, and each Python snippet,
run as is, prints what its comments say. So the guide's examples cannot drift."""

import contextlib
import io
import json
import pathlib
import re
import shlex

import httpx
import pytest

from conftest import REPO_ROOT
from serve_utils import Server

GUIDE = REPO_ROOT / "docs" / "tasks" / "serve.md"
DOCUMENTED = "http://127.0.0.1:8000"  # the guide's server address
VOLATILE = {"id", "created"}  # per-request values: compared by kind


def _blocks() -> list[tuple[str, str]]:
  """(language, text) of each fenced block of the guide's "Reward requests" section."""
  section = GUIDE.read_text().split("\n## Reward requests\n", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"^```(\w+)\n(.*?)^```$", section, re.M | re.S)


def _command(text: str) -> list[str]:
  return shlex.split(text.replace("\\\n", " "))


def _start_flags() -> tuple[list[str], str]:
  """The guide's server command: its `--config.*` flags but the policy's, and the model
  name that policy's directory gives the server."""
  [start] = [_command(text) for lang, text in _blocks()
             if lang == "bash" and text.startswith("helpsteer-jax ")]
  policy = next(a.split("=", 1)[1] for a in start if a.startswith("--config.init.source="))
  flags = [a for a in start if a.startswith("--config.") and "init.source" not in a]
  return flags, pathlib.Path(policy).name


@pytest.fixture(scope="module")
def server(served_models, tmp_path_factory):
  flags, name = _start_flags()
  assert "--config.scorer.source=demo_rules" in flags  # no trained attribute model needed
  running = Server(served_models, tmp_path_factory.mktemp("docs_server"),
                   "--config.serve.warmup=false", "--config.scorer.head=",
                   f"--config.serve.model_name={name}", *flags, api_key=None)
  yield running
  running.stop()


def _same(documented, got, where: str = "") -> None:
  """`got` has `documented`'s shape and values (numbers to 1e-6; `VOLATILE` fields by
  kind: the same type, an id the same prefix)."""
  if isinstance(documented, dict):
    assert isinstance(got, dict) and sorted(got) == sorted(documented), (where, got)
    for key, value in documented.items():
      if key in VOLATILE:
        assert type(got[key]) is type(value), (where, key, got[key])
        if key == "id":
          assert got[key].split("-")[0] == value.split("-")[0], (where, got[key])
      else:
        _same(value, got[key], f"{where}.{key}")
  elif isinstance(documented, list):
    assert isinstance(got, list) and len(got) == len(documented), (where, got)
    for i, (a, b) in enumerate(zip(documented, got)):
      _same(a, b, f"{where}[{i}]")
  elif isinstance(documented, float):
    assert got == pytest.approx(documented, rel=1e-6, abs=1e-6), (where, got)
  else:
    assert got == documented, (where, got)


def test_every_curl_request_gets_the_documented_answer(server):
  blocks = _blocks()
  sent = []
  for (lang, text), (next_lang, answer) in zip(blocks, blocks[1:]):
    if lang != "bash" or not text.startswith("curl "):
      continue
    args = _command(text)
    url = next(a for a in args if a.startswith(DOCUMENTED))
    headers = dict(args[i + 1].split(": ", 1) for i, a in enumerate(args) if a == "-H")
    body = args[args.index("-d") + 1]
    response = httpx.post(url.replace(DOCUMENTED, server.base), content=body, headers=headers,
                          timeout=120)
    assert response.status_code == 200, (url, response.text)
    assert next_lang == "json", url  # each request is followed by its answer
    _same(json.loads(answer), response.json(), url)
    sent.append(url[len(DOCUMENTED):])
  assert sent == ["/v1/rewards", "/get_reward", "/classify"]


def test_every_python_example_prints_what_its_comments_say(server):
  examples = [text for lang, text in _blocks() if lang == "python"]
  assert len(examples) == 3
  for text in examples:
    said = [line.split("#", 1)[1].strip() for line in text.splitlines()
            if line.startswith("print(")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      exec(compile(text.replace(DOCUMENTED, server.base), str(GUIDE), "exec"), {})
    assert out.getvalue().splitlines() == said, text
