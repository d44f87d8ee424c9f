"""The OpenAI-compatible HTTP API (FastAPI): models, chat, completions, rewards (also in
OpenRLHF's and vLLM's classify protocols), stats, and the web playground at `/`.

Every request is checked before it reaches the engine; a bad one is a 4xx
with OpenAI's error object and the server keeps serving. The routes
(routes_*.py) share one `AppState` (state.py) and hand their rows to the
engine through jobs.py; a client that goes away cancels its rows.
"""

from __future__ import annotations

import asyncio

import fastapi
from absl import logging
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from helpsteer_jax.serve import (
  guard,
  openapi,
  playground,
  protocol,
  routes_completions,
  routes_info,
  routes_rewards,
)
from helpsteer_jax.serve.backend import AttributeModel, CompileCounter, Policy
from helpsteer_jax.serve.state import AppState, Settings

__all__ = ["Settings", "create_app"]


def create_app(policy: Policy, settings: Settings, attribute_model: AttributeModel | None = None,
               compiles: CompileCounter | None = None) -> fastapi.FastAPI:
  """The API over a started engine (stopped, draining its rows, at shutdown)."""
  app = fastapi.FastAPI(title="helpsteer-jax", lifespan=_lifespan)
  app.state.serve = AppState(policy, settings, attribute_model, compiles)
  app.add_exception_handler(protocol.ApiError, _api_error)
  app.add_exception_handler(HTTPException, _http_error)
  app.add_exception_handler(Exception, _internal_error)
  app.add_middleware(guard.Guard, api_key=settings.api_key, hosts=settings.allowed_hosts,
                     max_body=settings.max_request_bytes)
  # This order is the order of /openapi.json's paths.
  for router in (routes_info.models_router, routes_completions.router, routes_rewards.router,
                 routes_info.stats_router):
    app.include_router(router)
  openapi.install(app, [protocol.ChatRequest, protocol.CompletionRequest,
                        protocol.RewardRequest, protocol.GetRewardRequest,
                        protocol.ClassifyRequest])
  playground.add_routes(app, {
      "model": settings.model_name, "attributes": settings.attributes,
      "system": settings.system, "temperature": settings.temperature,
      "max_tokens": settings.max_tokens, "rewards": attribute_model is not None,
      "api_key": bool(settings.api_key)})
  return app


async def _lifespan(app: fastapi.FastAPI):
  yield
  await asyncio.to_thread(app.state.serve.engine.stop)


async def _api_error(request: fastapi.Request, e: protocol.ApiError) -> JSONResponse:
  return JSONResponse(e.body(), status_code=e.status)


async def _http_error(request: fastapi.Request, e: HTTPException) -> JSONResponse:
  return JSONResponse(protocol.ApiError(str(e.detail), e.status_code).body(),
                      status_code=e.status_code, headers=e.headers)  # 405: Allow


async def _internal_error(request: fastapi.Request, e: Exception) -> JSONResponse:
  logging.error("internal error on %s %s: %r", request.method, request.url.path, e)
  return JSONResponse(protocol.ApiError("internal server error", 500,
                                        kind="server_error").body(), status_code=500)
