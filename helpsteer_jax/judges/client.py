"""An LLM judge behind an OpenAI-compatible endpoint, and the cache of its replies.

The official `openai` client does the HTTP: it retries connection errors,
timeouts, 429 and 5xx replies with exponential backoff (`max_retries`), which
is what a long judging run against a rate-limited API needs. Every reply is
appended to a cache file keyed by everything that determines it (judge model,
prompts, temperature, max_tokens) and synced, so a rerun, or a run killed
half-way, never asks the same question twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import threading

from absl import logging

from helpsteer_jax.errors import ConfigError


class JudgeError(RuntimeError):
  """The judge failed one request after its retries."""


def _openai():
  try:
    import openai
  except ImportError:
    raise ConfigError("the OpenAI-compatible judge needs the openai client:"
                      " pip install 'helpsteer-jax[eval]' (or pip install openai)") from None
  return openai


def served_models(base_url: str, api_key_env: str = "OPENAI_API_KEY") -> list[str]:
  """The model ids an OpenAI-compatible endpoint lists (ConfigError when it cannot be
  asked)."""
  openai = _openai()
  key = os.environ.get(api_key_env, "") if api_key_env else ""
  client = openai.OpenAI(base_url=base_url, api_key=key or "none", max_retries=1)
  try:
    return [m.id for m in client.models.list()]
  except openai.APIError as e:
    raise ConfigError(f"{base_url}: listing its models failed: {e}") from None


class OpenAIJudge:
  """Chat completions from `model` at `base_url` (temperature 0, as FastChat)."""

  def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY",
               max_retries: int = 5, timeout: float = 120.0, temperature: float = 0.0,
               max_tokens: int = 2048):
    if not base_url.startswith(("http://", "https://")):
      raise ConfigError(f"judge.base_url={base_url!r}: give the endpoint's base URL, e.g."
                        " https://api.openai.com/v1 or http://127.0.0.1:8000/v1")
    if not model:
      raise ConfigError("judge.model is empty: name the judge model (e.g. gpt-4)")
    openai = _openai()
    self.model, self.base_url = model, base_url
    self.temperature, self.max_tokens = temperature, max_tokens
    key = os.environ.get(api_key_env, "") if api_key_env else ""
    self.client = openai.OpenAI(base_url=base_url, api_key=key or "none",
                                max_retries=max_retries, timeout=timeout)

  def check(self) -> None:
    """ConfigError unless the endpoint answers and serves `model` (before any generation)."""
    openai = _openai()
    try:
      names = [m.id for m in self.client.with_options(max_retries=1).models.list()]
    except openai.APIConnectionError as e:
      raise ConfigError(f"judge.base_url={self.base_url}: cannot connect ({e.__cause__ or e});"
                        " start the judge server or fix the URL") from None
    except openai.AuthenticationError as e:
      raise ConfigError(f"judge.base_url={self.base_url} refused the API key ({e.status_code}):"
                        " set the variable judge.api_key_env names") from None
    except openai.NotFoundError:
      logging.warning("judge: %s does not list its models; judge.model=%s is not checked",
                      self.base_url, self.model)
      return
    except openai.APIError as e:
      raise ConfigError(f"judge.base_url={self.base_url}: listing models failed: {e}") from None
    if self.model not in names:
      raise ConfigError(f"judge.model={self.model!r} is not served by {self.base_url}; it serves"
                        f" {', '.join(names[:20]) or 'no models'}")

  def cache_key(self, system: str, user: str) -> str:
    blob = json.dumps([self.model, system, user, self.temperature, self.max_tokens])
    return hashlib.sha256(blob.encode()).hexdigest()

  def __call__(self, system: str, user: str) -> str:
    """The judge's reply; JudgeError after the client's retries are spent."""
    openai = _openai()
    try:
      reply = self.client.chat.completions.create(
          model=self.model, temperature=self.temperature, max_tokens=self.max_tokens,
          messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])
    except openai.APIError as e:
      raise JudgeError(f"{type(e).__name__}: {e}") from None
    return reply.choices[0].message.content or ""


class JudgmentCache:
  """key -> judge reply, persisted as JSON lines (a torn last line is dropped)."""

  def __init__(self, path: pathlib.Path):
    self.path = path
    self.replies: dict[str, str] = {}
    self._lock = threading.Lock()
    if path.exists():
      data = path.read_bytes()
      if not data.endswith(b"\n") and data:  # a torn last write: appends must start a line
        data = data[:data.rfind(b"\n") + 1]
        path.write_bytes(data)
      for line in data.decode("utf-8").splitlines():
        try:
          row = json.loads(line)
          self.replies[row["key"]] = row["judgment"]
        except (ValueError, KeyError, TypeError):
          logging.warning("%s: skipping an unreadable line (a torn write)", path)

  def get(self, key: str) -> str | None:
    return self.replies.get(key)

  def put(self, key: str, judgment: str, **info) -> None:
    with self._lock:
      self.replies[key] = judgment
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"key": key, "judgment": judgment, **info}) + "\n")
        f.flush()
        os.fsync(f.fileno())
