"""The OpenAI-compatible HTTP API (FastAPI): models, chat, completions, rewards, stats,
and the web playground at `/`.

Every request is checked before it reaches the engine; a bad one is a 4xx
with OpenAI's error object and the server keeps serving. A generation's
choices are submitted to the engine as separate rows and their updates come
back through an asyncio queue; a client that goes away cancels its rows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import secrets
from typing import Any, AsyncIterator

import fastapi
import numpy as np
import pydantic
from absl import logging
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from helpsteer_jax.data import template
from helpsteer_jax.inference import engine as engine_lib
from helpsteer_jax.inference import steering
from helpsteer_jax.scoring import rewards as rewards_lib
from helpsteer_jax.serve import playground, protocol
from helpsteer_jax.serve.backend import AttributeModel, CompileCounter, Policy

DISCONNECT_POLL_SECONDS = 0.5


@dataclasses.dataclass
class Settings:
  """What the API enforces and defaults to (config.serve, config.sampling)."""

  model_name: str
  attributes: dict[str, int]
  system: str = template.DEFAULT_SYSTEM
  api_key: str = ""
  max_tokens: int = 1024       # the largest max_tokens a request may ask for
  max_n: int = 8
  temperature: float = 1.0     # OpenAI's defaults
  top_p: float = 1.0


@dataclasses.dataclass
class _Job:
  """One request's rows, ready for the engine."""

  prompt_ids: list[int]
  max_tokens: int
  temperature: float
  top_p: float
  seeds: list[int]
  stop_strings: tuple[str, ...]
  chat: bool


def _parse(model: type[pydantic.BaseModel], raw: bytes) -> Any:
  try:
    data = json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise protocol.ApiError(f"the request body is not valid JSON: {e}") from None
  if not isinstance(data, dict):
    raise protocol.ApiError("the request body must be a JSON object")
  try:
    return model.model_validate(data)
  except pydantic.ValidationError as e:
    raise protocol.validation_error(e) from None


def create_app(policy: Policy, settings: Settings, attribute_model: AttributeModel | None = None,
               compiles: CompileCounter | None = None) -> fastapi.FastAPI:
  """The API over a started engine (stopped, draining its rows, at shutdown)."""
  engine = policy.engine

  async def lifespan(app):
    yield
    await asyncio.to_thread(engine.stop)

  app = fastapi.FastAPI(title="helpsteer-jax", lifespan=lifespan)

  @app.exception_handler(protocol.ApiError)
  async def api_error(request, e: protocol.ApiError):
    return JSONResponse(e.body(), status_code=e.status)

  @app.exception_handler(HTTPException)
  async def http_error(request, e: HTTPException):
    return JSONResponse(protocol.ApiError(str(e.detail), e.status_code).body(),
                        status_code=e.status_code)

  @app.middleware("http")
  async def check_key(request: fastapi.Request, call_next):
    if settings.api_key and request.url.path.startswith("/v1/"):
      given = request.headers.get("authorization", "")
      if not secrets.compare_digest(given.encode(), f"Bearer {settings.api_key}".encode()):
        e = protocol.ApiError("invalid or missing API key: send 'Authorization: Bearer <key>'",
                              401, code="invalid_api_key")
        return JSONResponse(e.body(), status_code=401)
    return await call_next(request)

  def check_model(name: str | None) -> None:
    if name != settings.model_name:
      raise protocol.ApiError(f"the model {name!r} does not exist; this server serves"
                              f" {settings.model_name!r}", param="model", code="model_not_found")

  def job(req, prompt_ids: list[int], chat: bool) -> _Job:
    check_model(req.model)
    if req.n > settings.max_n:
      raise protocol.ApiError(f"n={req.n} is above this server's limit {settings.max_n}",
                              param="n")
    asked = getattr(req, "max_completion_tokens", None) or req.max_tokens
    room = engine.max_length - len(prompt_ids)
    if room < 1:
      raise protocol.ApiError(
          f"the prompt has {len(prompt_ids)} tokens; this model's context length is"
          f" {engine.max_length}", param="messages" if chat else "prompt",
          code="context_length_exceeded")
    if asked is not None and asked > settings.max_tokens:
      raise protocol.ApiError(f"max_tokens={asked} is above this server's limit"
                              f" {settings.max_tokens}", param="max_tokens")
    if asked is not None and asked > room:
      raise protocol.ApiError(
          f"the prompt has {len(prompt_ids)} tokens; with max_tokens={asked} that exceeds"
          f" this model's context length {engine.max_length}", param="max_tokens",
          code="context_length_exceeded")
    seed = random.getrandbits(31) if req.seed is None else req.seed
    return _Job(prompt_ids, asked or min(settings.max_tokens, room),
                settings.temperature if req.temperature is None else req.temperature,
                settings.top_p if req.top_p is None else req.top_p,
                [(seed + i) % 2**32 for i in range(req.n)], req.stop_strings(), chat)

  def submit(j: _Job) -> tuple[asyncio.Queue, list[engine_lib.Handle]]:
    loop, updates = asyncio.get_running_loop(), asyncio.Queue()
    handles = []
    try:
      for i, seed in enumerate(j.seeds):
        put = lambda u, i=i: loop.call_soon_threadsafe(updates.put_nowait, (i, u))
        handles.append(engine.submit(engine_lib.DecodeRequest(
            prompt_ids=j.prompt_ids, max_tokens=j.max_tokens, on_update=put,
            temperature=j.temperature, top_p=j.top_p, seed=seed,
            stop_strings=j.stop_strings)))
    except RuntimeError as e:  # shutting down
      for h in handles:
        h.cancel()
      raise protocol.ApiError(str(e), 503, kind="server_error") from None
    return updates, handles

  def final_text(j: _Job, u: engine_lib.Update) -> str:
    if u.finish_reason == "error":
      raise protocol.ApiError(f"generation failed: {u.text}", 500, kind="server_error")
    return steering.response_text(u.text, u.finish_reason) if j.chat else u.text

  async def collect(j: _Job, request: fastapi.Request) -> list[engine_lib.Update] | None:
    updates, handles = submit(j)
    finals: dict[int, engine_lib.Update] = {}
    try:
      while len(finals) < len(handles):
        try:
          i, u = await asyncio.wait_for(updates.get(), DISCONNECT_POLL_SECONDS)
        except asyncio.TimeoutError:
          if await request.is_disconnected():
            return None
          continue
        if u.finish_reason:
          finals[i] = u
    finally:
      for h in handles:
        h.cancel()
    return [finals[i] for i in range(len(handles))]

  async def stream(j: _Job, include_usage: bool) -> AsyncIterator[str]:
    writer = protocol.ChunkWriter(settings.model_name, j.chat)
    updates, handles = submit(j)
    shown = [""] * len(handles)
    done, tokens = 0, 0
    try:
      if j.chat:
        for i in range(len(handles)):
          yield _event(writer.chunk(i, "", role=True))
      while done < len(handles):
        i, u = await updates.get()
        if u.finish_reason == "error":
          yield _event(protocol.ApiError(f"generation failed: {u.text}", 500,
                                         kind="server_error").body())
          return
        delta = u.delta
        if u.finish_reason:
          text = final_text(j, u)
          delta = text[len(shown[i]):]
          done, tokens = done + 1, tokens + u.completion_tokens
        shown[i] += delta
        if delta:
          yield _event(writer.chunk(i, delta))
        if u.finish_reason:
          yield _event(writer.chunk(i, None if j.chat else "", u.finish_reason))
      if include_usage:
        yield _event(writer.chunk(None, None, usage_=protocol.usage(len(j.prompt_ids), tokens)))
      yield "data: [DONE]\n\n"
    finally:  # also when the client went away: free its rows
      for h in handles:
        h.cancel()

  async def respond(j: _Job, req, request: fastapi.Request, make) -> Response:
    if req.stream:
      include = bool(req.stream_options and req.stream_options.include_usage)
      return StreamingResponse(stream(j, include), media_type="text/event-stream")
    finals = await collect(j, request)
    if finals is None:
      return Response(status_code=499)  # the client closed the connection
    texts = [(final_text(j, u), u.finish_reason) for u in finals]
    return JSONResponse(make(settings.model_name, texts, len(j.prompt_ids),
                             sum(u.completion_tokens for u in finals)))

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [{"id": settings.model_name, "object": "model",
                                        "created": 0, "owned_by": "helpsteer-jax"}]}

  @app.post("/v1/chat/completions")
  async def chat(request: fastapi.Request):
    req = _parse(protocol.ChatRequest, await request.body())
    given, param = req.requested_attributes()
    attributes = protocol.attributes(given, settings.attributes, param)
    label = template.label_string(attributes)
    conv = protocol.conversation(req.messages, label, settings.system)
    prompt = template.generation_prompt(conv, attributes)
    j = job(req, policy.encode(prompt), chat=True)
    logging.info("chat: stream=%s n=%d prompt_tokens=%d max_tokens=%d attributes=%s",
                 req.stream, req.n, len(j.prompt_ids), j.max_tokens, label)
    return await respond(j, req, request, protocol.chat_response)

  @app.post("/v1/completions")
  async def completions(request: fastapi.Request):
    req = _parse(protocol.CompletionRequest, await request.body())
    j = job(req, policy.encode(req.prompt), chat=False)
    return await respond(j, req, request, protocol.completion_response)

  @app.post("/v1/rewards")
  async def rewards(request: fastapi.Request):
    req = _parse(protocol.RewardRequest, await request.body())
    if attribute_model is None:
      raise protocol.ApiError("this server has no attribute model: start it with"
                              " --config.scorer.source=<attribute_model workdir>", 404,
                              code="not_found")
    if (req.items is None) == (req.texts is None):
      raise protocol.ApiError("give either 'items' ([{messages, response}]) or 'texts'",
                              param="items")
    try:
      weights = (attribute_model.weights if req.weights is None
                 else rewards_lib.weight_vector(req.weights))
    except Exception as e:  # noqa: BLE001 - ConfigError naming the unknown attribute
      raise protocol.ApiError(f"weights: {e}", param="weights") from None
    if req.items is not None:
      convs = [protocol.scored_conversation(it.messages, it.response) for it in req.items]
    else:
      try:
        convs = [template.parse_regression_text(text) for text in req.texts]
      except ValueError as e:
        raise protocol.ApiError(f"texts: {e}", param="texts") from None
    preds = await asyncio.to_thread(attribute_model.scorer, convs)
    scored = [None if np.isnan(p).any() else p for p in preds]
    rewards_ = [None if p is None else float(rewards_lib.rewards(p[None], weights)[0])
                for p in scored]
    return {"object": "list", "model": settings.model_name,
            "data": protocol.reward_rows(scored, rewards_)}

  @app.get("/stats")
  async def stats():
    return {**engine.stats, "busy_rows": engine.busy_rows, "waiting": len(engine.waiting),
            "compiled_variants": engine.compiled_variants,
            "compiles": None if compiles is None else compiles.count}

  playground.add_routes(app, {
      "model": settings.model_name, "attributes": settings.attributes,
      "system": settings.system, "temperature": settings.temperature,
      "max_tokens": settings.max_tokens, "rewards": attribute_model is not None,
      "api_key": bool(settings.api_key)})
  return app


def _event(data: dict) -> str:
  return f"data: {json.dumps(data)}\n\n"
