"""Serving (an OpenAI-compatible HTTP server) for a SteerLM model.

Loads the model as generate does, optionally loads the attribute model for
/v1/rewards, warms both up (every compiled shape, under a progress bar of programs
of the total), and runs uvicorn on `serve.host:serve.port`, which prints a "ready"
line with the address once it listens, until SIGTERM / Ctrl-C, which stops
accepting connections, lets in-flight requests finish and exits 0.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import threading
import time

import jax
import ml_collections
from absl import logging

from helpsteer_jax import cpu_env
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.progress import Progress
from helpsteer_jax.runs import setup as setup_lib
from helpsteer_jax.serve import app as app_lib
from helpsteer_jax.serve import backend, guard

API_KEY_ENV = "HELPSTEER_API_KEY"
ABORT_GRACE_SECONDS = 5  # after the drain time: for the aborted requests' answers to go out


def model_name(config: ml_collections.ConfigDict) -> str:
  """`serve.model_name`, else the model directory's name."""
  if config.serve.model_name:
    return config.serve.model_name
  path = config.init.source
  return pathlib.Path(path).expanduser().resolve().name if path else "helpsteer-jax"


def settings(config: ml_collections.ConfigDict) -> app_lib.Settings:
  s = config.serve
  if s.max_tokens < 1 or s.max_n < 1:
    raise ConfigError(f"serve.max_tokens={s.max_tokens} and serve.max_n={s.max_n} must be >= 1")
  if not 0 <= config.sampling.temperature <= 2 or not 0 < config.sampling.top_p <= 1:
    raise ConfigError("sampling.temperature must be in 0..2 and sampling.top_p in (0, 1]")
  if s.max_request_bytes < 0:
    raise ConfigError(f"serve.max_request_bytes={s.max_request_bytes} must be >= 0 (0: sized"
                      " for the context)")
  api_key = s.api_key or os.environ.get(API_KEY_ENV, "")
  if not api_key and s.host not in guard.LOOPBACK_HOSTS:
    if not s.allow_no_key:
      raise ConfigError(
          f"serve.host={s.host!r} is reachable from other machines and no API key is set:"
          f" set ${API_KEY_ENV} (or serve.api_key), or pass --config.serve.allow_no_key=true"
          " to serve without one")
    logging.warning("serving on %s without an API key: anyone who can reach it can generate",
                    s.host)
  return app_lib.Settings(
      model_name=model_name(config), attributes=backend.default_attributes(config),
      system=config.system, api_key=api_key,
      allowed_hosts=guard.allowed_hosts(s.allowed_hosts, s.host),
      max_request_bytes=s.max_request_bytes,
      max_tokens=s.max_tokens, max_n=s.max_n, temperature=float(config.sampling.temperature),
      top_p=float(config.sampling.top_p),
      judge_guidelines=bool(config.scorer.judge_guidelines))


def request_bytes(limit: int, max_length: int) -> int:
  """`serve.max_request_bytes`, or for 0 room for a whole context of text written as JSON
  escapes: 32 bytes per token, at least 1 MiB."""
  return limit or max(1 << 20, 32 * max_length)


def warm_up(parts: list) -> None:
  """Runs the warm-up of `parts` (the engine, the attribute model: each with `warm_up`,
  `warm_up_programs` and `compiled_variants`) under one progress bar on process 0:
  programs compiled or read from the compilation cache, of the total they will run."""
  def compiled() -> int:
    return sum(part.compiled_variants for part in parts)

  bar = Progress(total=sum(part.warm_up_programs for part in parts), initial=compiled(),
                 desc="serve: warm-up", unit="program")
  try:
    for part in parts:
      part.warm_up(lambda: bar.update_to(compiled()))
  finally:
    bar.close()


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  if jax.process_count() > 1:
    raise ConfigError("serve runs in one process; shard a large model over that process's"
                      " devices with --config.mesh.tensor")
  import uvicorn
  api = settings(config)  # bad settings fail before loading the model
  compiles = backend.CompileCounter()
  # Compiling frees gigabytes in small pieces that glibc would keep resident.
  cpu_env.trim_after_compiles()
  setup = setup_lib.prepare(config, workdir, tokenizer=False, model=False)
  # The scorer first: a judge whose budget cannot work is refused before the policy loads.
  attribute_model = backend.load_attribute_model(config, setup.rt)
  policy = backend.load_policy(config, setup.rt, setup.workdir)
  start = time.perf_counter()
  if config.serve.warmup:
    # Every length bucket of the scorer too: no compile while serving.
    warm_up([policy.engine] + ([attribute_model.scorer] if attribute_model is not None
                               and hasattr(attribute_model.scorer, "warm_up") else []))
  cpu_env.trim()  # what warm-up's loading and runs freed
  policy.engine.start()
  api = dataclasses.replace(api, max_request_bytes=request_bytes(
      config.serve.max_request_bytes, policy.engine.max_length))
  app = app_lib.create_app(policy, api, attribute_model, compiles)
  spent = compiles.snapshot()
  address = f"http://{config.serve.host}:{config.serve.port}"
  ready = (f"serve: {api.model_name} ready: API {address}/v1, playground {address}/ (warmed"
           f" up in {time.perf_counter() - start:.1f}s ({spent.compiles} compiles,"
           f" {spent.cache_hits} of them read from the compilation cache;"
           f" {' + '.join(f'{s:.1f}s {k}' for k, s in spent.seconds.items())}))")
  drain = config.serve.drain_seconds
  engine = policy.engine

  class Server(uvicorn.Server):
    """uvicorn's server, whose first exit signal also starts the drain timer: when it
    runs out, the engine ends what is left ("abort"), so every client still gets an
    error (a stream's error event and `[DONE]`, or a 503) before connections close; it
    prints the ready line once it listens."""

    async def startup(self, sockets=None):
      await super().startup(sockets)
      if self.started:  # listening: a client may connect now
        print(ready, flush=True)

    def handle_exit(self, sig, frame):
      if not self.should_exit:
        timer = threading.Timer(drain, engine.abort, (
            f"the server is shutting down: generation did not finish within its drain"
            f" time of {drain}s",))
        timer.daemon = True
        timer.start()
      super().handle_exit(sig, frame)

  server = Server(uvicorn.Config(
      app, host=config.serve.host, port=config.serve.port, log_level="info",
      timeout_graceful_shutdown=drain + ABORT_GRACE_SECONDS))
  # uvicorn drains on SIGTERM / SIGINT, then re-raises the signal to the handler
  # it found: with this one, a drained server returns and the process exits 0.
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: None)
  server.run()
  stats = dict(policy.engine.stats)
  print(f"serve: stopped after {stats['requests']} requests", flush=True)
  return stats
