"""The one object every route reads (`app.state.serve`): the policy, the settings, the
attribute model and the compile counter."""

from __future__ import annotations

import dataclasses
from typing import Callable

import fastapi

from helpsteer_jax.data import template
from helpsteer_jax.inference.engine import Engine
from helpsteer_jax.serve import completions as completions_lib
from helpsteer_jax.serve import guard, protocol
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
  judge_guidelines: bool = True  # a GenRM comparison's prompt form (scorer.judge_guidelines)


@dataclasses.dataclass
class AppState:
  """The API's view of the server: what it serves and with which limits."""

  policy: Policy
  settings: Settings
  attribute_model: AttributeModel | None = None
  compiles: CompileCounter | None = None
  vocab: int = dataclasses.field(init=False)  # the token ids a prompt may hold: [0, vocab)
  token_text: Callable[[int], str] = dataclasses.field(init=False)  # cached per server
  # The tokenizer's special tokens but SteerLM's markers (BOS, EOS, padding): what a decode
  # leaves around a rendered chat.
  special_texts: tuple[str, ...] = dataclasses.field(init=False)

  def __post_init__(self):
    self.vocab = min(len(self.policy.tokenizer), self.engine.cfg.vocab_size)
    self.token_text = completions_lib.token_texts(self.policy.tokenizer)
    self.special_texts = tuple(t for t in self.policy.tokenizer.all_special_tokens
                               if t and t not in template.MARKERS)

  @property
  def engine(self) -> Engine:
    return self.policy.engine

  def check_model(self, name: str | None) -> None:
    """A 400 (model_not_found) unless `name` is the served model's."""
    if name != self.settings.model_name:
      raise protocol.ApiError(f"the model {name!r} does not exist; this server serves"
                              f" {self.settings.model_name!r}", param="model",
                              code="model_not_found")


def of(request: fastapi.Request) -> AppState:
  """The state of the app serving `request`."""
  return request.app.state.serve
