"""The HTTP API's request bodies and response shapes (OpenAI's, plus steering and rewards).

Requests are pydantic models that refuse unknown fields, so a parameter the
server does not implement is a 400 naming it rather than silently ignored.
Responses are plain dicts in the shapes of OpenAI's chat completion, chat
completion chunk, completion and error objects, OpenRLHF's reward body and vLLM's
classification response.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, Literal

import numpy as np
import pydantic

from helpsteer_jax.data import template
from helpsteer_jax.data.records import ATTRIBUTES, NUM_ATTRIBUTES, Conversation, Turn
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.sampling import MAX_LOGPROBS
from helpsteer_jax.scoring.scorer import REWARD_SLOT

MAX_STOP_STRINGS = 4  # as OpenAI's API


class ApiError(Exception):
  """An error answered as OpenAI's error object with an HTTP status."""

  def __init__(self, message: str, status: int = 400, param: str | None = None,
               code: str | None = None, kind: str = "invalid_request_error"):
    super().__init__(message)
    self.message, self.status, self.param, self.code, self.kind = (
        message, status, param, code, kind)

  def body(self) -> dict:
    return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                      "code": self.code}}


class _Strict(pydantic.BaseModel):
  # NaN and infinities are refused as what they are, not as out of a range.
  model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)


def check_unicode(data: Any) -> None:
  """ApiError naming the first string (key or value) of a parsed JSON body that is not
  Unicode text: JSON's `\\ud800` escapes can carry lone surrogates, which no tokenizer
  encodes."""
  todo = [("", data)]
  while todo:
    where, value = todo.pop()
    if isinstance(value, dict):
      for key, item in value.items():
        todo.append((f"{where}.{key}" if where else str(key), key))
        todo.append((f"{where}.{key}" if where else str(key), item))
    elif isinstance(value, list):
      todo.extend((f"{where}.{i}" if where else str(i), item) for i, item in enumerate(value))
    elif isinstance(value, str):
      try:
        value.encode("utf-8")
      except UnicodeEncodeError:
        raise ApiError(f"{where}: the text holds a lone surrogate (an unpaired \\ud800-"
                       "\\udfff escape), which is not Unicode text",
                       param=where or None) from None


class StreamOptions(_Strict):
  include_usage: bool = False


class TextPart(_Strict):
  type: Literal["text"]
  text: str


class Message(_Strict):
  # response_1, response_2, principle: a GenRM comparison's (serve.judge_chat)
  role: Literal["system", "developer", "user", "assistant", "response_1", "response_2",
                "principle"]
  content: str | list[TextPart]
  name: str | None = None

  @pydantic.field_validator("content", mode="before")
  @classmethod
  def _text_parts_only(cls, content: Any) -> Any:
    if isinstance(content, list):
      for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
          raise ValueError(f"this model reads text only: content parts must have type"
                           f" 'text', not {kind!r}")
    elif not isinstance(content, str):
      raise ValueError("give a string or a list of text parts")
    return content

  def text(self) -> str:
    return self.content if isinstance(self.content, str) else "".join(
        p.text for p in self.content)


class _Sampling(_Strict):
  model: str
  max_tokens: int | None = pydantic.Field(None, ge=1)
  temperature: float | None = pydantic.Field(None, ge=0.0, le=2.0)
  top_p: float | None = pydantic.Field(None, gt=0.0, le=1.0)
  n: int = pydantic.Field(1, ge=1)
  stop: str | list[str] | None = None
  seed: int | None = None
  stream: bool = False
  stream_options: StreamOptions | None = None
  user: str | None = None

  def stop_strings(self) -> tuple[str, ...]:
    stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
    if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
      raise ApiError(f"stop: give up to {MAX_STOP_STRINGS} non-empty strings", param="stop")
    return tuple(stops)


class ChatRequest(_Sampling):
  messages: list[Message] = pydantic.Field(min_length=1)
  max_completion_tokens: int | None = pydantic.Field(None, ge=1)
  attributes: dict[str, Any] | str | None = None
  # vLLM's and SGLang's way to pass template variables: one client steers either server.
  chat_template_kwargs: dict[str, Any] | None = None

  def requested_attributes(self) -> tuple[dict[str, Any] | str | None, str]:
    """The attributes asked for and the parameter that asked (`attributes` or
    `chat_template_kwargs.attributes`)."""
    kwargs = dict(self.chat_template_kwargs or {})
    unknown = sorted(set(kwargs) - {"attributes"})
    if unknown:
      raise ApiError(f"chat_template_kwargs: this model's template takes only 'attributes',"
                     f" not {', '.join(map(repr, unknown))}",
                     param=f"chat_template_kwargs.{unknown[0]}")
    if "attributes" in kwargs:
      if self.attributes is not None:
        raise ApiError("give the attributes once: `attributes` or"
                       " `chat_template_kwargs.attributes`, not both", param="attributes")
      return kwargs["attributes"], "chat_template_kwargs.attributes"
    return self.attributes, "attributes"


class CompletionRequest(_Sampling):
  # A string, a list of strings, a list of token ids or a list of such lists: checked by
  # `completions.prompts`, which names the form that is wrong.
  prompt: Any
  max_tokens: int | None = pydantic.Field(None, ge=0)  # 0: with echo, only score the prompt
  echo: bool = False
  logprobs: int | None = pydantic.Field(None, ge=0, le=MAX_LOGPROBS)


class RewardItem(_Strict):
  messages: list[Message] = pydantic.Field(min_length=1)
  response: str


class RewardRequest(_Strict):
  model: str | None = None
  items: list[RewardItem] | None = None
  texts: list[str] | None = None  # attribute-model input texts (the remote scorer's form)
  weights: dict[str, float] | None = None


class GetRewardRequest(_Strict):
  """OpenRLHF's remote reward model body (`openrlhf/cli/serve_rm.py`, sent by
  `remote_rm_fn_ray`): the rendered conversations, with their prompts and dataset labels
  (both optional, one per query, not read: an attribute model needs neither)."""

  query: list[str] = pydantic.Field(min_length=1)
  prompts: list[str] | None = None
  labels: list[Any] | None = None


class ClassifyRequest(_Strict):
  """vLLM's pooling `/classify` body (`ClassificationRequest`, as verl's reward loop sends
  it). `activation` (vLLM before 0.11.2) and `use_activation` ask for a softmax over
  class logits, which regression predictions do not have: only false (verl's) or absent is
  taken. `add_special_tokens` is taken and changes nothing: the attribute model builds its
  own input ids from the parsed conversation, as it was trained."""

  model: str | None = None
  input: str | list[str]
  activation: bool | None = None
  use_activation: bool | None = None
  add_special_tokens: bool | None = None
  user: str | None = None

  @pydantic.field_validator("input", mode="before")
  @classmethod
  def _texts_only(cls, given: Any) -> Any:
    if not (isinstance(given, str) or (isinstance(given, list)
                                       and all(isinstance(t, str) for t in given))):
      raise ValueError("give a text or a list of texts (this server takes no token ids)")
    return given

  def texts(self) -> list[str]:
    texts = [self.input] if isinstance(self.input, str) else list(self.input)
    if not texts:
      raise ApiError("input: give a text or a non-empty list of texts", param="input")
    for name in ("activation", "use_activation"):
      if getattr(self, name):
        raise ApiError(f"{name}: this model's outputs are regression predictions and their"
                       " weighted reward, not class logits to softmax: send false or leave"
                       " it out", param=name)
    return texts


def validation_error(error: pydantic.ValidationError) -> ApiError:
  """The first problem of a request body as a 400."""
  first = error.errors()[0]
  where = ".".join(str(p) for p in first["loc"])
  if first["type"] == "extra_forbidden":
    return ApiError(f"unrecognized request argument supplied: {where}", param=where)
  return ApiError(f"{where}: {first['msg']}" if where else first["msg"], param=where or None)


def attributes(given: Any, defaults: dict[str, int],
               param: str = "attributes") -> dict[str, int]:
  """The request's attributes (an object or a label string, given as `param`) over the
  model's defaults."""
  try:
    if isinstance(given, str):
      given = template.parse_label_string(given)
    elif given is not None and not isinstance(given, dict):
      raise ValueError(f"give an object or a label string, not {type(given).__name__}")
    return steering.checked({**defaults, **(given or {})})
  except ValueError as e:
    raise ApiError(f"{param}: {e}", param=param) from None


def conversation(messages: list[Message], label: str | None = None,
                 system: str = template.DEFAULT_SYSTEM) -> Conversation:
  """SteerLM conversation of chat messages: a leading system message becomes its system.

  Earlier assistant turns carry `label` (the attributes of this request),
  as every assistant turn does in AC-SFT data. The last message must be the
  user's.
  """
  if messages[0].role in ("system", "developer"):
    system, messages = messages[0].text(), messages[1:]
  turns = []
  for i, m in enumerate(messages):
    if m.role in ("system", "developer"):
      raise ApiError("messages: a system message may only come first", param="messages")
    if m.role not in ("user", "assistant"):
      raise ApiError(f"messages: the role {m.role!r} belongs to a GenRM comparison, sent to"
                     " /v1/chat/completions as its last two messages", param="messages")
    role = "User" if m.role == "user" else "Assistant"
    turns.append(Turn(role, m.text(), label if role == "Assistant" else None))
  if not turns or turns[-1].role != "User":
    raise ApiError("messages: the last message must be the user's", param="messages")
  return Conversation(system, tuple(turns), mask_role="User")


def scored_conversation(messages: list[Message], response: str) -> Conversation:
  """The conversation `messages` answered by `response` (what the attribute model scores)."""
  conv = conversation(messages)
  return dataclasses.replace(conv, turns=conv.turns + (Turn("Assistant", response),))


def _ids(prefix: str) -> tuple[str, int]:
  return f"{prefix}-{uuid.uuid4().hex}", int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
  return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
          "total_tokens": prompt_tokens + completion_tokens}


def chat_response(model: str, texts: list[tuple[str, str]], prompt_tokens: int,
                  completion_tokens: int) -> dict:
  """`chat.completion`: one choice per (text, finish_reason)."""
  rid, created = _ids("chatcmpl")
  return {"id": rid, "object": "chat.completion", "created": created, "model": model,
          "choices": [{"index": i, "message": {"role": "assistant", "content": text},
                       "logprobs": None, "finish_reason": finish}
                      for i, (text, finish) in enumerate(texts)],
          "usage": usage(prompt_tokens, completion_tokens)}


def completion_response(model: str, texts: list[tuple[str, str]], prompt_tokens: int,
                        completion_tokens: int, logprobs: list[dict | None] | None = None
                        ) -> dict:
  """`text_completion`: one choice per (text, finish_reason), with its `logprobs` object."""
  rid, created = _ids("cmpl")
  logprobs = logprobs or [None] * len(texts)
  return {"id": rid, "object": "text_completion", "created": created, "model": model,
          "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}
                      for i, ((text, finish), lp) in enumerate(zip(texts, logprobs))],
          "usage": usage(prompt_tokens, completion_tokens)}


class ChunkWriter:
  """Server-sent events of one streamed response (OpenAI's chunk objects)."""

  def __init__(self, model: str, chat: bool):
    self.id, self.created = _ids("chatcmpl" if chat else "cmpl")
    self.model, self.chat = model, chat

  def chunk(self, index: int | None, text: str | None, finish: str | None = None,
            role: bool = False, usage_: dict | None = None) -> dict:
    out = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
           "created": self.created, "model": self.model, "choices": []}
    if index is not None:
      if self.chat:
        delta = {} if text is None else {"content": text}
        if role:
          delta = {"role": "assistant", **delta}
        out["choices"] = [{"index": index, "delta": delta, "logprobs": None,
                           "finish_reason": finish}]
      else:
        out["choices"] = [{"index": index, "text": text or "", "logprobs": None,
                           "finish_reason": finish}]
    if usage_ is not None:
      out["usage"] = usage_
    return out


def reward_rows(predictions, rewards) -> list[dict]:
  """One `{index, attributes, reward}` per scored item (None: too long to score)."""
  out = []
  for i, (pred, reward) in enumerate(zip(predictions, rewards)):
    scored = pred is not None
    out.append({"index": i, "object": "reward",
                "attributes": dict(zip(ATTRIBUTES, map(float, pred))) if scored else None,
                "reward": float(reward) if scored else None})
  return out


def classify_response(model: str, predictions: np.ndarray, rewards: np.ndarray,
                      prompt_tokens: int | None) -> dict:
  """vLLM's `ClassificationResponse` for [n, 9] predictions and their [n] rewards: each
  item's `probs` is the nine predictions then the reward (`probs[-1]`, what verl reads),
  its `label` the attribute predicted highest (vLLM's label: the argmax class's name)."""
  rid, created = _ids("classify")
  data = [{"index": i, "label": ATTRIBUTES[int(np.argmax(pred))],
           "probs": [*map(float, pred), float(reward)], "num_classes": NUM_ATTRIBUTES + 1}
          for i, (pred, reward) in enumerate(zip(predictions, rewards))]
  return {"id": rid, "object": "list", "created": created, "model": model, "data": data,
          "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens,
                    "completion_tokens": 0, "prompt_tokens_details": None}}


def get_reward_response(predictions: np.ndarray, rewards: np.ndarray,
                        judged: bool = False) -> dict:
  """OpenRLHF's reward body: `rewards` and `scores` (the weighted reward, which OpenRLHF's
  dynamic filtering reads as `scores`) and `extra_logs`, one list per attribute; for a
  generative judge (`judged`) only its own reward, unweighted, in the column it writes
  (`scorer.REWARD_SLOT`)."""
  rewards_ = [float(r) for r in rewards]
  names = (REWARD_SLOT,) if judged else ATTRIBUTES
  return {"rewards": rewards_, "scores": list(rewards_),
          "extra_logs": {name: [float(v) for v in predictions[:, ATTRIBUTES.index(name)]]
                         for name in names}}
