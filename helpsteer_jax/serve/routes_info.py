"""The routes that only report: /v1/models (the served model) and /stats (the engine's
counters)."""

from __future__ import annotations

import fastapi

from helpsteer_jax.serve import openapi
from helpsteer_jax.serve import state as state_lib

# Two routers: /stats is included after the /v1/ routes, where /openapi.json lists it.
models_router = fastapi.APIRouter()
stats_router = fastapi.APIRouter()


@models_router.get("/v1/models", responses=openapi.errors(400, 401))
async def models(request: fastapi.Request):
  name = state_lib.of(request).settings.model_name
  return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                      "owned_by": "helpsteer-jax"}]}


@stats_router.get("/stats")
async def stats(request: fastapi.Request):
  state = state_lib.of(request)
  engine, compiles = state.engine, state.compiles
  return {**engine.stats, "busy_rows": engine.busy_rows, "waiting": len(engine.waiting),
          "compiled_variants": engine.compiled_variants,
          "compiles": None if compiles is None else compiles.count,
          "compile_cache_hits": None if compiles is None else compiles.cache_hits}
