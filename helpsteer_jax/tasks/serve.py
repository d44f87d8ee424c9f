"""Serving (an OpenAI-compatible HTTP server) for a SteerLM model.

Loads the model as generate does, warms the engine up (every compiled shape),
optionally loads the attribute model for /v1/rewards, and runs uvicorn on
`serve.host:serve.port` until SIGTERM / Ctrl-C, which stops accepting
connections, lets in-flight requests finish and exits 0.
"""

from __future__ import annotations

import os
import pathlib
import signal
import time

import jax
import ml_collections

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.serve import app as app_lib
from helpsteer_jax.serve import backend
from helpsteer_jax.tasks import setup as setup_lib

API_KEY_ENV = "HELPSTEER_API_KEY"


def model_name(config: ml_collections.ConfigDict) -> str:
  """`serve.model_name`, else the model directory's name."""
  if config.serve.model_name:
    return config.serve.model_name
  path = config.init.hf_path or config.init.checkpoint
  return pathlib.Path(path).expanduser().resolve().name if path else "helpsteer-jax"


def settings(config: ml_collections.ConfigDict) -> app_lib.Settings:
  s = config.serve
  if s.max_tokens < 1 or s.max_n < 1:
    raise ConfigError(f"serve.max_tokens={s.max_tokens} and serve.max_n={s.max_n} must be >= 1")
  if not 0 <= config.sampling.temperature <= 2 or not 0 < config.sampling.top_p <= 1:
    raise ConfigError("sampling.temperature must be in 0..2 and sampling.top_p in (0, 1]")
  return app_lib.Settings(
      model_name=model_name(config), attributes=backend.default_attributes(config),
      system=config.system, api_key=s.api_key or os.environ.get(API_KEY_ENV, ""),
      max_tokens=s.max_tokens, max_n=s.max_n, temperature=float(config.sampling.temperature),
      top_p=float(config.sampling.top_p))


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  if jax.process_count() > 1:
    raise ConfigError("serve runs in one process; shard a large model over that process's"
                      " devices with --config.mesh.tensor")
  import uvicorn
  api = settings(config)  # bad settings fail before loading the model
  compiles = backend.CompileCounter()
  setup = setup_lib.prepare(config, workdir, tokenizer=False, model=False)
  policy = backend.load_policy(config, setup.rt, setup.workdir)
  attribute_model = backend.load_attribute_model(config, setup.rt)
  start = time.perf_counter()
  if config.serve.warmup:
    policy.engine.warm_up()
    if attribute_model is not None and hasattr(attribute_model.scorer, "warm_up"):
      attribute_model.scorer.warm_up()  # every length bucket: no compile while serving
  policy.engine.start()
  app = app_lib.create_app(policy, api, attribute_model, compiles)
  print(f"serve: {api.model_name} warmed up in {time.perf_counter() - start:.1f}s"
        f" ({compiles.count} compiles); API http://{config.serve.host}:{config.serve.port}/v1,"
        f" playground http://{config.serve.host}:{config.serve.port}/", flush=True)
  server = uvicorn.Server(uvicorn.Config(
      app, host=config.serve.host, port=config.serve.port, log_level="info",
      timeout_graceful_shutdown=config.serve.drain_seconds))
  # uvicorn drains on SIGTERM / SIGINT, then re-raises the signal to the handler
  # it found: with this one, a drained server returns and the process exits 0.
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: None)
  server.run()
  stats = dict(policy.engine.stats)
  print(f"serve: stopped after {stats['requests']} requests", flush=True)
  return stats
