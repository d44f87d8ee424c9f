"""A server for the serve tests: tiny random models on disk and the CLI run on loopback.

The policy is a tiny random model with the demo tokenizer; the attribute
model a demo-shaped backbone with a random head file. The server is
`python -m helpsteer_jax.main --config=configs/serve.py` in a subprocess
(one CPU device, API key `KEY`), its output in `<root>/server.log`. The models are
built once per test run and the server started once per pytest process (the
`served_models` and `server` fixtures of tests/conftest.py); a test that stops its
server starts one of its own (`own_server`).
"""

import json
import os
import runpy
import subprocess
import sys
import time

import httpx
import numpy as np
import openai

from helpsteer_jax.config_sections import DEMO_SHAPE
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.load import reward as reward_model
from helpsteer_jax.models import builder, catalog, hf

from conftest import REPO_ROOT, xla_flags
from multiprocess import free_port

KEY = "test-key"
MAX_LENGTH = 2048  # tokens per row: long enough a generation to go away from, or to stop
MAX_TOKENS = 1900  # the largest max_tokens a request may ask for
SCORER_MAX_LEN = 512  # the attribute model's, whose every length bucket warm-up compiles


def write_models(root) -> None:
  """The policy (`root/policy`), the attribute model (`root/rm`) and its head file."""
  tok_dir = demo_tokenizer.build_demo_tokenizer(root / "tok")
  policy = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  hf.save_hf_model(policy, root / "policy", dtype="float32", tokenizer=str(tok_dir))
  # The attribute model: a demo-shaped backbone and a random head file.
  cfg = catalog.model_config("tiny", **DEMO_SHAPE)
  hf.save_hf_model(builder.create(cfg, seed=1), root / "rm", dtype="float32",
                   tokenizer=str(tok_dir))
  rng = np.random.default_rng(0)
  reward_model.save_head(root / "head.npz", {
      "kernel": rng.normal(size=(cfg.hidden_size, len(ATTRIBUTES))).astype(np.float32),
      "bias": rng.normal(size=len(ATTRIBUTES)).astype(np.float32)})


def own_server(models, root, *flags: str) -> "Server":
  """A server of its own on `models` for a test that stops it: no warm-up (the programs
  compile on first use), `flags` added to its command line."""
  return Server(models, root, "--config.serve.warmup=false", *flags)


def serve_config():
  """configs/serve.py's default config, as the server builds it."""
  return runpy.run_path(str(REPO_ROOT / "configs" / "serve.py"))["get_config"]()


class Server:
  """The server of `models` (write_models' directory) on a free loopback port, started and
  waited for (up to 10 minutes); its log and workdir in `root`; `api_key` None: none."""

  def __init__(self, models, root, *flags: str, api_key: str | None = KEY):
    self.models = models
    self.port = free_port()
    self.base = f"http://127.0.0.1:{self.port}"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(1))
    env.pop("HELPSTEER_API_KEY", None)
    if api_key is not None:
      env["HELPSTEER_API_KEY"] = api_key
    self.log = open(root / "server.log", "w")
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "helpsteer_jax.main", "--config=configs/serve.py",
         f"--config.init.source={models / 'policy'}", "--config.serve.model_name=tiny",
         f"--config.serve.port={self.port}", f"--config.serve.max_length={MAX_LENGTH}",
         "--config.serve.max_batch=4", f"--config.serve.max_tokens={MAX_TOKENS}",
         "--config.serve.max_n=3", f"--config.scorer.source={models / 'rm'}",
         f"--config.scorer.head={models / 'head.npz'}",
         f"--config.scorer.max_len={SCORER_MAX_LEN}", f"--workdir={root / 'workdir'}", *flags],
        cwd=REPO_ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, text=True)
    self.root = root
    self._clients: list[openai.OpenAI] = []
    deadline = time.time() + 600
    while True:
      assert self.proc.poll() is None, self.output()
      try:
        self.stats()
        break
      except httpx.TransportError:
        assert time.time() < deadline, self.output()
        time.sleep(1)
    self.warm_compiles = self.stats()["compiles"]

  def output(self) -> str:
    return (self.root / "server.log").read_text()[-4000:]

  def stats(self) -> dict:
    return httpx.get(f"{self.base}/stats", timeout=10).json()

  def client(self, key: str = KEY) -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{self.base}/v1", api_key=key, max_retries=0, timeout=300)
    self._clients.append(client)  # closed by stop()
    return client

  def post(self, path: str, body, key: str = KEY, **kw) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{self.base}/v1/{path}", content=content, timeout=300,
                      headers={"Authorization": f"Bearer {key}",
                               "Content-Type": "application/json"}, **kw)

  def stop(self) -> None:
    for client in self._clients:
      client.close()
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()
    self.log.close()
