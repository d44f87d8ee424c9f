"""A POST body read into its request model, off the event loop, with OpenAI's errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import fastapi
import pydantic

from helpsteer_jax.serve import protocol


async def read(request: fastapi.Request, model: type[pydantic.BaseModel]) -> Any:
  """The request's body as `model` (a 400 naming what is wrong when it is not one)."""
  return await asyncio.to_thread(parse, model, await request.body())


def parse(model: type[pydantic.BaseModel], raw: bytes) -> Any:
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
