"""What every HTTP request passes before a route sees it (an ASGI middleware).

In order: the `Host` header against an allow-list (a page on another site
that re-points its name at this machine, DNS rebinding, cannot read replies);
the API key on `/v1/` and the RL frameworks' reward routes (`Authorization: Bearer
<key>`, the scheme in any case, as HTTP scheme names are); for POST, a JSON
content type (a cross-site form or `text/plain` post cannot start a generation) and
a body-size limit, checked before the body is read or parsed.
HEAD is answered as GET without the body.

A plain ASGI middleware, not Starlette's `BaseHTTPMiddleware`: after the
body, `receive` is the server's own, so a route still hears the client
disconnect.
"""

from __future__ import annotations

import secrets
from typing import Any, Awaitable, Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from helpsteer_jax.serve import protocol

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("", "0.0.0.0", "::")
KEYED_PATHS = ("/v1/", "/get_reward", "/classify")  # what the API key guards (prefixes)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


def allowed_hosts(setting: str, bind_host: str) -> frozenset[str] | None:
  """The Host names served: `setting` (comma-separated; "*" = any, None), else the
  loopback names and the address the server binds."""
  if setting.strip() == "*":
    return None
  names = [h.strip().lower() for h in setting.split(",") if h.strip()]
  if not names:
    names = list(LOOPBACK_HOSTS)
    if bind_host not in WILDCARD_BINDS:
      names.append(bind_host.lower())
  return frozenset(n.strip("[]") for n in names)


def host_name(header: str) -> str:
  """A Host header's name without its port ("[::1]:8000" -> "::1")."""
  header = header.strip().lower()
  if header.startswith("["):
    return header[1:].split("]", 1)[0]
  return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def key_matches(authorization: str, key: str) -> bool:
  scheme, _, token = authorization.strip().partition(" ")
  return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(),
                                                               key.encode())


class Guard:
  """Refuses bad hosts, keys, content types and oversized bodies with OpenAI error
  objects (400, 401, 415, 413); answers HEAD as GET."""

  def __init__(self, app, *, api_key: str, hosts: frozenset[str] | None, max_body: int):
    self.app, self.api_key, self.hosts, self.max_body = app, api_key, hosts, max_body

  async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
      await self.app(scope, receive, send)
      return
    headers = Headers(scope=scope)
    error = self._refusal(scope, headers)
    if error is None and scope["method"] == "POST":
      body, error = await self._read_body(headers, receive)
      if body is None and error is None:
        return  # the client went away while sending
      if error is None:
        receive = _replay(body, receive)
    if error is not None:
      await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
      return
    if scope["method"] == "HEAD":
      scope, send = dict(scope, method="GET"), _without_body(send)
    await self.app(scope, receive, send)

  def _refusal(self, scope: Scope, headers: Headers) -> protocol.ApiError | None:
    if self.hosts is not None and host_name(headers.get("host", "")) not in self.hosts:
      return protocol.ApiError(
          f"the Host header {headers.get('host', '')!r} is not served here; the server"
          " answers " + ", ".join(sorted(self.hosts)) + " (serve.allowed_hosts)",
          code="invalid_host")
    if self.api_key and scope["path"].startswith(KEYED_PATHS) and not key_matches(
        headers.get("authorization", ""), self.api_key):
      return protocol.ApiError("invalid or missing API key: send 'Authorization: Bearer <key>'",
                               401, code="invalid_api_key")
    if scope["method"] == "POST":
      media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
      if media != "application/json":
        return protocol.ApiError(
            f"Content-Type must be application/json (got {media or 'none'!r})", 415,
            code="unsupported_media_type")
    return None

  def _too_large(self) -> protocol.ApiError:
    return protocol.ApiError(f"the request body is larger than this server's limit of"
                             f" {self.max_body} bytes (serve.max_request_bytes)", 413,
                             code="request_too_large")

  async def _read_body(self, headers: Headers, receive: Receive
                       ) -> tuple[bytes | None, protocol.ApiError | None]:
    """The whole body, or the refusal of one over the limit (read no further)."""
    declared = headers.get("content-length")
    if declared is not None:
      if not declared.strip().isdigit():
        return None, protocol.ApiError("the Content-Length header is not a number")
      if int(declared) > self.max_body:
        return None, self._too_large()
    chunks, size = [], 0
    while True:
      message = await receive()
      if message["type"] == "http.disconnect":
        return None, None
      chunk = message.get("body", b"")
      size += len(chunk)
      if size > self.max_body:
        return None, self._too_large()
      chunks.append(chunk)
      if not message.get("more_body", False):
        return b"".join(chunks), None


def _replay(body: bytes, receive: Receive) -> Receive:
  """`receive` that gives the body read already, then the server's messages (the
  client's disconnect)."""
  sent = False

  async def replay() -> dict:
    nonlocal sent
    if not sent:
      sent = True
      return {"type": "http.request", "body": body, "more_body": False}
    return await receive()

  return replay


def _without_body(send: Send) -> Send:
  async def head(message: dict) -> None:
    if message["type"] == "http.response.body":
      message = {**message, "body": b""}
    await send(message)

  return head
