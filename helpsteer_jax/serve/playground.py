"""The web playground at `/`: the page, its static files and the settings it starts from.

The page (static/: plain HTML, CSS and JavaScript, nothing fetched from
elsewhere) is a client of the same API as any other: it streams
/v1/chat/completions with the sliders' `attributes` and scores each answer
with /v1/rewards. Neither the page nor its settings need the API key; the
page asks for it and sends it with its /v1/ requests.
"""

from __future__ import annotations

import pathlib
from typing import Any

import fastapi
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles

STATIC = pathlib.Path(__file__).with_name("static")


def add_routes(app: fastapi.FastAPI, page_config: dict[str, Any]) -> None:
  """`GET /` (the page), `/static/*` (its files) and `GET /playground/config`
  (`page_config`: model name, steerable attributes with their defaults, ...)."""

  @app.get("/", include_in_schema=False)
  async def page():
    return FileResponse(STATIC / "index.html")

  @app.get("/playground/config")
  async def config():
    return page_config

  app.mount("/static", StaticFiles(directory=STATIC), name="static")
