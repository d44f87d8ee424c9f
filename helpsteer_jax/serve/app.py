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
import math
import random
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
from helpsteer_jax.serve import completions as completions_lib
from helpsteer_jax.serve import guard, openapi, playground, protocol
from helpsteer_jax.serve.backend import AttributeModel, CompileCounter, Policy


@dataclasses.dataclass
class Settings:
  """What the API enforces and defaults to (config.serve, config.sampling)."""

  model_name: str
  attributes: dict[str, int]
  system: str = template.DEFAULT_SYSTEM
  api_key: str = ""
  allowed_hosts: frozenset[str] | None = frozenset(guard.LOOPBACK_HOSTS)  # None: any
  max_request_bytes: int = 1 << 20
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
  echo: str = ""  # text shown before each choice's (completions' `echo`)


def _parse(model: type[pydantic.BaseModel], raw: bytes) -> Any:
  try:
    data = json.loads(raw)
  except RecursionError:
    raise protocol.ApiError("the request body is not valid JSON: nested too deeply") from None
  except ValueError as e:  # also UnicodeDecodeError, and integers past Python's digit limit
    raise protocol.ApiError(f"the request body is not valid JSON: {e}") from None
  if not isinstance(data, dict):
    raise protocol.ApiError("the request body must be a JSON object")
  protocol.check_unicode(data)
  try:
    return model.model_validate(data)
  except pydantic.ValidationError as e:
    raise protocol.validation_error(e) from None


def create_app(policy: Policy, settings: Settings, attribute_model: AttributeModel | None = None,
               compiles: CompileCounter | None = None) -> fastapi.FastAPI:
  """The API over a started engine (stopped, draining its rows, at shutdown)."""
  engine = policy.engine
  vocab = min(len(policy.tokenizer), engine.cfg.vocab_size)
  token_text = completions_lib.token_texts(policy.tokenizer)

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
                        status_code=e.status_code, headers=e.headers)  # 405: Allow

  @app.exception_handler(Exception)
  async def internal_error(request, e: Exception):
    logging.error("internal error on %s %s: %r", request.method, request.url.path, e)
    return JSONResponse(protocol.ApiError("internal server error", 500,
                                          kind="server_error").body(), status_code=500)

  app.add_middleware(guard.Guard, api_key=settings.api_key, hosts=settings.allowed_hosts,
                     max_body=settings.max_request_bytes)

  def check_model(name: str | None) -> None:
    if name != settings.model_name:
      raise protocol.ApiError(f"the model {name!r} does not exist; this server serves"
                              f" {settings.model_name!r}", param="model", code="model_not_found")

  def job(req, prompt_ids: list[int], chat: bool, echo: str = "") -> _Job:
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
    return _Job(prompt_ids, min(settings.max_tokens, room) if asked is None else asked,
                settings.temperature if req.temperature is None else req.temperature,
                settings.top_p if req.top_p is None else req.top_p,
                [(seed + i) % 2**32 for i in range(req.n)], req.stop_strings(), chat, echo)

  def choices(jobs: list[_Job]) -> list[_Job]:
    """Each choice's job: prompt i's sample j is choice i * n + j (OpenAI's numbering)."""
    return [j for j in jobs for _ in j.seeds]

  def submit(jobs: list[_Job]) -> tuple[asyncio.Queue, list[engine_lib.Handle | None]]:
    """Every choice's row (None for a job generating nothing); (choice, update)s arrive
    on the queue."""
    loop, updates = asyncio.get_running_loop(), asyncio.Queue()
    handles = []
    try:
      for j in jobs:
        for seed in j.seeds:
          i = len(handles)
          if j.max_tokens == 0:
            handles.append(None)
            continue
          put = lambda u, i=i: loop.call_soon_threadsafe(updates.put_nowait, (i, u))
          handles.append(engine.submit(engine_lib.DecodeRequest(
              prompt_ids=j.prompt_ids, max_tokens=j.max_tokens, on_update=put,
              temperature=j.temperature, top_p=j.top_p, seed=seed,
              stop_strings=j.stop_strings)))
    except RuntimeError as e:  # shutting down
      cancel(handles)
      raise protocol.ApiError(str(e), 503, kind="server_error") from None
    return updates, handles

  def ended_by_server(u: engine_lib.Update) -> protocol.ApiError | None:
    """The error of a row the engine ended: 500 for a failure, 503 for a shutdown."""
    if u.finish_reason == "error":
      return protocol.ApiError(f"generation failed: {u.text}", 500, kind="server_error")
    if u.finish_reason == "abort":
      return protocol.ApiError(u.text, 503, kind="server_error", code="shutting_down")
    return None

  def cancel(handles: list[engine_lib.Handle | None]) -> None:
    for h in handles:
      if h is not None:
        h.cancel()

  def final_text(j: _Job, u: engine_lib.Update) -> str:
    failure = ended_by_server(u)
    if failure is not None:
      raise failure
    return steering.response_text(u.text, u.finish_reason) if j.chat else u.text

  async def collect(jobs: list[_Job], request: fastapi.Request
                    ) -> list[engine_lib.Update] | None:
    """Every choice's final update (None if the client went away: its rows are
    cancelled as soon as the server hears of it)."""
    updates, handles = submit(jobs)
    finals = {i: engine_lib.Update("", 0, "length") for i, h in enumerate(handles) if h is None}
    gone = asyncio.ensure_future(_disconnect(request))
    try:
      while len(finals) < len(handles):
        update = asyncio.ensure_future(updates.get())
        await asyncio.wait((update, gone), return_when=asyncio.FIRST_COMPLETED)
        if not update.done():
          update.cancel()
          return None
        i, u = update.result()
        if u.finish_reason:
          finals[i] = u
    finally:
      gone.cancel()
      cancel(handles)
    return [finals[i] for i in range(len(handles))]

  async def stream(jobs: list[_Job], include_usage: bool) -> AsyncIterator[str]:
    chat = jobs[0].chat
    writer = protocol.ChunkWriter(settings.model_name, chat)
    updates, handles = submit(jobs)
    of = choices(jobs)
    shown = [""] * len(handles)
    done, tokens = 0, 0
    try:
      for i, (j, h) in enumerate(zip(of, handles)):
        if chat:
          yield _event(writer.chunk(i, "", role=True))
        if j.echo:
          yield _event(writer.chunk(i, j.echo))
        if h is None:
          yield _event(writer.chunk(i, "", "length"))
          done += 1
      while done < len(handles):
        i, u = await updates.get()
        j = of[i]
        failure = ended_by_server(u)
        if failure is not None:
          yield _event(failure.body())
          yield "data: [DONE]\n\n"
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
        yield _event(writer.chunk(None, None, usage_=protocol.usage(prompt_tokens(jobs),
                                                                    tokens)))
      yield "data: [DONE]\n\n"
    finally:  # also when the client went away: free its rows
      cancel(handles)

  def prompt_tokens(jobs: list[_Job]) -> int:
    return sum(len(j.prompt_ids) for j in jobs)

  def streamed(req, jobs: list[_Job]) -> Response:
    include = bool(req.stream_options and req.stream_options.include_usage)
    return StreamingResponse(stream(jobs, include), media_type="text/event-stream")

  async def respond(j: _Job, req, request: fastapi.Request) -> Response:
    if req.stream:
      return streamed(req, [j])
    finals = await collect([j], request)
    if finals is None:
      return Response(status_code=499)  # the client closed the connection
    texts = [(final_text(j, u), u.finish_reason) for u in finals]
    return JSONResponse(protocol.chat_response(settings.model_name, texts, len(j.prompt_ids),
                                               sum(u.completion_tokens for u in finals)))

  post_errors = openapi.errors(400, 401, 413, 415, 503)

  @app.get("/v1/models", responses=openapi.errors(400, 401))
  async def models():
    return {"object": "list", "data": [{"id": settings.model_name, "object": "model",
                                        "created": 0, "owned_by": "helpsteer-jax"}]}

  @app.post("/v1/chat/completions", openapi_extra=openapi.body(protocol.ChatRequest),
            responses=post_errors)
  async def chat(request: fastapi.Request):
    req = await asyncio.to_thread(_parse, protocol.ChatRequest, await request.body())
    given, param = req.requested_attributes()
    attributes = protocol.attributes(given, settings.attributes, param)
    label = template.label_string(attributes)

    def render() -> list[int]:
      conv = protocol.conversation(req.messages, label, settings.system)
      return policy.encode(template.generation_prompt(conv, attributes))

    j = job(req, await asyncio.to_thread(render), chat=True)  # off the event loop
    logging.info("chat: stream=%s n=%d prompt_tokens=%d max_tokens=%d attributes=%s",
                 req.stream, req.n, len(j.prompt_ids), j.max_tokens, label)
    return await respond(j, req, request)

  @app.post("/v1/completions", openapi_extra=openapi.body(protocol.CompletionRequest),
            responses=post_errors)
  async def completions(request: fastapi.Request):
    req = await asyncio.to_thread(_parse, protocol.CompletionRequest, await request.body())
    check_model(req.model)
    if req.max_tokens == 0 and not req.echo:
      raise protocol.ApiError("max_tokens=0 generates nothing: give echo=true to score the"
                              " prompt, or max_tokens >= 1", param="max_tokens")
    if req.stream and req.logprobs is not None:
      raise protocol.ApiError("logprobs with stream is not supported", param="logprobs")
    prompts = await asyncio.to_thread(completions_lib.prompts, req.prompt,
                                      policy.encode_plain, policy.decode, vocab)
    jobs = [job(req, ids, chat=False, echo=text if req.echo else "") for ids, text in prompts]
    logging.info("completions: stream=%s prompts=%d n=%d prompt_tokens=%d max_tokens=%d"
                 " echo=%s logprobs=%s", req.stream, len(jobs), req.n, prompt_tokens(jobs),
                 jobs[0].max_tokens, req.echo, req.logprobs)
    if req.stream:
      return streamed(req, jobs)
    scores = [None] * len(jobs)
    if req.echo and req.logprobs is not None:
      try:
        scores = [asyncio.wrap_future(engine.score(j.prompt_ids)) for j in jobs]
      except RuntimeError as e:  # shutting down
        raise protocol.ApiError(str(e), 503, kind="server_error") from None
    finals = await collect(jobs, request)
    scores = [s if s is None else await s for s in scores]
    if finals is None:
      return Response(status_code=499)
    of, score_of = choices(jobs), [s for s, j in zip(scores, jobs) for _ in j.seeds]
    texts = [(j.echo + final_text(j, u), u.finish_reason) for j, u in zip(of, finals)]
    logprobs = None
    if req.logprobs is not None:
      logprobs = [completions_lib.logprobs_object(
          req.logprobs, token_text,
          ([(j.prompt_ids, s)] if req.echo else []) + ([(u.token_ids, u.raw)] if u.raw else []))
          for j, u, s in zip(of, finals, score_of)]
    return JSONResponse(protocol.completion_response(
        settings.model_name, texts, prompt_tokens(jobs),
        sum(u.completion_tokens for u in finals), logprobs))

  @app.post("/v1/rewards", openapi_extra=openapi.body(protocol.RewardRequest),
            responses={**post_errors, **openapi.errors(404)})
  async def rewards(request: fastapi.Request):
    req = await asyncio.to_thread(_parse, protocol.RewardRequest, await request.body())
    if req.model is not None:
      check_model(req.model)
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
    if not all(r is None or math.isfinite(r) for r in rewards_):
      raise protocol.ApiError("weights: the weighted reward overflows; give smaller weights",
                              param="weights")
    return {"object": "list", "model": settings.model_name,
            "data": protocol.reward_rows(scored, rewards_)}

  @app.get("/stats")
  async def stats():
    return {**engine.stats, "busy_rows": engine.busy_rows, "waiting": len(engine.waiting),
            "compiled_variants": engine.compiled_variants,
            "compiles": None if compiles is None else compiles.count}

  openapi.install(app, [protocol.ChatRequest, protocol.CompletionRequest,
                        protocol.RewardRequest])
  playground.add_routes(app, {
      "model": settings.model_name, "attributes": settings.attributes,
      "system": settings.system, "temperature": settings.temperature,
      "max_tokens": settings.max_tokens, "rewards": attribute_model is not None,
      "api_key": bool(settings.api_key)})
  return app


async def _disconnect(request: fastapi.Request) -> None:
  """Returns when the client has gone away (the body has been read already)."""
  while (await request.receive())["type"] != "http.disconnect":
    pass


def _event(data: dict) -> str:
  return f"data: {json.dumps(data)}\n\n"
