"""An attribute scorer that asks a running server (`POST <url>/rewards`).

`best_of_n.scorer="http"` with `best_of_n.scorer_path=http://host:8000/v1`
scores with the attribute model a `configs/serve.py` server loaded, instead
of loading it in this process.
The key of a server started with one is read from $HELPSTEER_API_KEY.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from helpsteer_jax.data.records import ATTRIBUTES, NUM_ATTRIBUTES
from helpsteer_jax.errors import ConfigError

API_KEY_ENV = "HELPSTEER_API_KEY"


class HttpScorer:
  """Texts in the attribute model's input format -> [n, 9] (NaN: too long to score)."""

  def __init__(self, url: str, batch_size: int = 64, timeout: float = 600.0):
    if not url or not str(url).startswith(("http://", "https://")):
      raise ConfigError(f"the http scorer needs the server's base URL (e.g."
                        f" http://127.0.0.1:8000/v1) as its argument, got {url!r}")
    import httpx  # the serve extra: missing, it fails here rather than at the first call
    self._httpx = httpx
    key = os.environ.get(API_KEY_ENV, "")
    self.url = str(url).rstrip("/") + "/rewards"
    self.batch_size = batch_size
    self.timeout = timeout
    self.headers = {"Authorization": f"Bearer {key}"} if key else {}

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    out = np.full((len(texts), NUM_ATTRIBUTES), np.nan, np.float32)
    # A connection pool per call: nothing stays open between calls (a scorer has no close).
    with self._httpx.Client(timeout=self.timeout, headers=self.headers) as client:
      for lo in range(0, len(texts), self.batch_size):
        for index, row in self._post(client, texts[lo:lo + self.batch_size]):
          out[lo + index] = row
    return out

  def _post(self, client, texts: Sequence[str]) -> list[tuple[int, list[float]]]:
    """(index, attribute row) per scored text of one request."""
    response = client.post(self.url, json={"texts": list(texts)})
    if response.status_code != 200:
      raise ConfigError(f"the attribute scorer at {self.url} answered"
                        f" {response.status_code}: {response.text[:500]}")
    return [(row["index"], [row["attributes"][name] for name in ATTRIBUTES])
            for row in response.json()["data"] if row["attributes"] is not None]
