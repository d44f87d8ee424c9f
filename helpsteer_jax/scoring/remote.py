"""A server's attribute model (`POST <url>/rewards` of a configs/serve.py server).

The conversations travel as `items` (`messages` + `response`), the reward
API's structured form; the server renders them into the attribute model's
input. The key of a server started with one is read from $HELPSTEER_API_KEY.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from helpsteer_jax.data.records import ATTRIBUTES, NUM_ATTRIBUTES, Conversation
from helpsteer_jax.errors import ConfigError

API_KEY_ENV = "HELPSTEER_API_KEY"
URL_SCHEMES = ("http://", "https://")


def is_url(source: str) -> bool:
  return str(source).startswith(URL_SCHEMES)


def reward_item(conv: Conversation) -> dict:
  """`{messages, response}` of /v1/rewards for a conversation ending in its response."""
  *context, last = conv.turns
  messages = [{"role": "system", "content": conv.system}]  # also when empty: no default
  messages += [{"role": t.role.lower(), "content": t.text} for t in context]
  return {"messages": messages, "response": last.text}


class HttpScorer:
  """Conversations -> [n, 9] from a server (NaN: too long for its attribute model)."""

  def __init__(self, url: str, batch_size: int = 64, timeout: float = 600.0):
    if not is_url(url):
      raise ConfigError(f"the http scorer needs the server's base URL (e.g."
                        f" http://127.0.0.1:8000/v1), got {url!r}")
    import httpx  # the serve extra: missing, it fails here rather than at the first call
    self._httpx = httpx
    key = os.environ.get(API_KEY_ENV, "")
    self.url = str(url).rstrip("/") + "/rewards"
    self.batch_size = max(int(batch_size), 1)
    self.timeout = timeout
    self.headers = {"Authorization": f"Bearer {key}"} if key else {}

  def __call__(self, convs: Sequence[Conversation]) -> np.ndarray:
    out = np.full((len(convs), NUM_ATTRIBUTES), np.nan, np.float32)
    # A connection pool per call: nothing stays open between calls (a scorer has no close).
    with self._httpx.Client(timeout=self.timeout, headers=self.headers) as client:
      for lo in range(0, len(convs), self.batch_size):
        for index, row in self._post(client, convs[lo:lo + self.batch_size]):
          out[lo + index] = row
    return out

  def _post(self, client, convs: Sequence[Conversation]) -> list[tuple[int, list[float]]]:
    """(index, attribute row) per scored conversation of one request."""
    response = client.post(self.url, json={"items": [reward_item(c) for c in convs]})
    if response.status_code != 200:
      raise ConfigError(f"the attribute scorer at {self.url} answered"
                        f" {response.status_code}: {response.text[:500]}")
    return [(row["index"], [row["attributes"][name] for name in ATTRIBUTES])
            for row in response.json()["data"] if row["attributes"] is not None]
