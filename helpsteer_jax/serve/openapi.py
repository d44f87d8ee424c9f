"""The API's OpenAPI description (`/openapi.json`): request bodies and error responses.

The POST routes parse their own bodies (off the event loop, with OpenAI's
errors), so FastAPI does not see their request models; this module states
them, with the error object each route may answer, so that generated
clients and schema-driven fuzzers know the API.
"""

from __future__ import annotations

from typing import Any, Callable

import fastapi
import pydantic
from fastapi.openapi.utils import get_openapi


class ErrorDetail(pydantic.BaseModel):
  message: str
  type: str
  param: str | None = None
  code: str | None = None


class ErrorResponse(pydantic.BaseModel):
  """OpenAI's error object."""

  error: ErrorDetail


_WHY = {
    400: "a malformed or invalid request (the error names the parameter), or a Host name"
         " this server does not answer (code invalid_host)",
    401: "a missing or wrong API key (code invalid_api_key)",
    404: "no attribute model is loaded (code not_found)",
    405: "a method the route does not take (the Allow header names those it does)",
    413: "a body over serve.max_request_bytes (code request_too_large)",
    415: "a POST body that is not application/json (code unsupported_media_type)",
    503: "the server is shutting down (code shutting_down)",
}
_SCHEMA = "#/components/schemas/{model}"
_POST_ERRORS = (400, 401, 413, 415, 503)  # what any POST route may answer


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
  """`responses=` for a route: each status's error object and what it means."""
  return {s: {"model": ErrorResponse, "description": _WHY[s]} for s in statuses}


def body(model: type[pydantic.BaseModel]) -> dict[str, Any]:
  """`openapi_extra=` for a route that reads `model` as its JSON body."""
  ref = {"$ref": _SCHEMA.format(model=model.__name__)}
  return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def post(router: fastapi.APIRouter, path: str, model: type[pydantic.BaseModel],
         *more_errors: int) -> Callable[[Any], Any]:
  """`router.post(path)`, documented as reading `model` and answering the POST errors
  (and `more_errors`)."""
  return router.post(path, openapi_extra=body(model),
                     responses=errors(*_POST_ERRORS, *more_errors))


def install(app: fastapi.FastAPI, models: list[type[pydantic.BaseModel]]) -> None:
  """Makes `app.openapi()` include `models` (and the models they use) as components."""

  def openapi() -> dict[str, Any]:
    if app.openapi_schema is None:
      schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
      components = schema.setdefault("components", {}).setdefault("schemas", {})
      for model in models:
        model_schema = model.model_json_schema(ref_template=_SCHEMA)
        components.update(model_schema.pop("$defs", {}))
        components[model.__name__] = model_schema
      app.openapi_schema = schema
    return app.openapi_schema

  app.openapi = openapi
