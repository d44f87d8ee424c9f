"""The reward routes: the attribute model's predictions and weighted reward per conversation
(or a generative judge's reward, `scorer.judge`, in its column).

- `/v1/rewards`: this API's own (conversations as chat items, or attribute-model input texts);
- `/get_reward`: OpenRLHF's remote reward model protocol (`--remote_rm_url`);
- `/classify`: vLLM's pooling classify protocol (verl's discriminative reward model).

The two frameworks send rendered text: without the tokenizer's special tokens at its ends,
it is parsed back into the conversation the scorer scores (`template.parse_chat_text`: the
chat as a SteerLM policy renders it, labels dropped, or the attribute model's own input):
the same scorer, weights and numbers as `/v1/rewards`.
"""

from __future__ import annotations

import asyncio
import math
from typing import Callable, Sequence

import fastapi
import numpy as np

from helpsteer_jax import choices
from helpsteer_jax.data import template
from helpsteer_jax.data.records import Conversation
from helpsteer_jax.scoring import rewards as rewards_lib
from helpsteer_jax.serve import body, openapi, protocol
from helpsteer_jax.serve import state as state_lib
from helpsteer_jax.serve.backend import AttributeModel

router = fastapi.APIRouter()


@openapi.post(router, "/v1/rewards", protocol.RewardRequest, 404)
async def rewards(request: fastapi.Request):
  state = state_lib.of(request)
  req = await body.read(request, protocol.RewardRequest)
  if req.model is not None:
    state.check_model(req.model)
  attribute_model = _attribute_model(state)
  if (req.items is None) == (req.texts is None):
    raise protocol.ApiError("give either 'items' ([{messages, response}]) or 'texts'",
                            param="items")
  try:
    weights = (attribute_model.weights if req.weights is None
               else rewards_lib.weight_vector(req.weights))
  except Exception as e:  # noqa: BLE001 - ConfigError naming the unknown attribute
    raise protocol.ApiError(f"weights: {e}", param="weights") from None
  if req.items is not None:
    convs = [protocol.scored_conversation(it.messages, it.response) for it in req.items]
  else:
    convs = _conversations(req.texts, "texts", parse=template.parse_regression_text)
  preds = await asyncio.to_thread(attribute_model.scorer, convs)
  scored = [None if np.isnan(p).any() else p for p in preds]
  rewards_ = [None if p is None else float(rewards_lib.rewards(p[None], weights)[0])
              for p in scored]
  if not all(r is None or math.isfinite(r) for r in rewards_):
    raise protocol.ApiError("weights: the weighted reward overflows; give smaller weights",
                            param="weights")
  return {"object": "list", "model": state.settings.model_name,
          "data": protocol.reward_rows(scored, rewards_)}


@openapi.post(router, "/get_reward", protocol.GetRewardRequest, 404)
async def get_reward(request: fastapi.Request):
  """OpenRLHF's `{"query": [...], "prompts", "labels"}` -> `{"rewards", "scores",
  "extra_logs"}`."""
  state = state_lib.of(request)
  req = await body.read(request, protocol.GetRewardRequest)
  for name in ("prompts", "labels"):
    given = getattr(req, name)
    if given is not None and len(given) != len(req.query):
      raise protocol.ApiError(f"{name}: give one per query ({len(req.query)}), not"
                              f" {len(given)}", param=name)
  attribute_model = _attribute_model(state)
  convs = await asyncio.to_thread(_conversations, req.query, "query", state.special_texts)
  preds, rewards_ = await _scored(attribute_model, convs, "query")
  return protocol.get_reward_response(preds, rewards_, judged=bool(attribute_model.judge))


@openapi.post(router, "/classify", protocol.ClassifyRequest, 404)
async def classify(request: fastapi.Request):
  """vLLM's `{"model", "input"}` -> its classification response; `probs` = the nine
  predictions then the reward."""
  state = state_lib.of(request)
  req = await body.read(request, protocol.ClassifyRequest)
  if req.model is not None:
    state.check_model(req.model)
  texts = req.texts()
  attribute_model = _attribute_model(state)
  convs = await asyncio.to_thread(_conversations, texts, "input", state.special_texts,
                                 single=isinstance(req.input, str))
  preds, rewards_ = await _scored(attribute_model, convs, "input")
  tokens = (None if attribute_model.tokens is None
            else sum(await asyncio.to_thread(lambda: [attribute_model.tokens(c) for c in convs])))
  return protocol.classify_response(state.settings.model_name, preds, rewards_, tokens)


def _attribute_model(state: state_lib.AppState) -> AttributeModel:
  if state.attribute_model is None:
    raise protocol.ApiError("this server has no attribute model: start it with"
                            " --config.scorer.source=<attribute_model workdir> (or"
                            f" {choices.DEMO_RULES}: the demo data's rules, no trained model)",
                            404, code="not_found")
  return state.attribute_model


def _unwrapped(text: str, specials: tuple[str, ...]) -> str:
  """`text` without the special tokens a decode leaves at its ends (BOS, EOS, padding), as
  OpenRLHF's own reward server strips its tokenizer's padding and EOS."""
  trimmed = None
  while trimmed != text:
    trimmed = text
    for token in specials:
      text = text.removeprefix(token).removesuffix(token)
  return text


def _conversations(texts: Sequence[str], param: str, specials: tuple[str, ...] = (),
                   parse: Callable[[str], Conversation] = template.parse_chat_text,
                   single: bool = False) -> list[Conversation]:
  """Rendered chats, `specials` stripped at their ends, as conversations (`parse`); a 400
  naming the first that is not one (`param.index`, or `param` for a `single` text given
  as a string)."""
  convs = []
  for i, text in enumerate(texts):
    try:
      convs.append(parse(_unwrapped(text, specials)))
    except ValueError as e:
      where = param if single else f"{param}.{i}"
      raise protocol.ApiError(f"{where}: {e}", param=where) from None
  return convs


async def _scored(attribute_model: AttributeModel, convs: list[Conversation], param: str
                  ) -> tuple[np.ndarray, np.ndarray]:
  """([n, 9] predictions, [n] rewards at the configured weights); a 400 naming the first
  text not scored (these protocols have no null reward): too long for the attribute
  model, or, for a GenRM, no judgement of it that parses."""
  preds = np.asarray(await asyncio.to_thread(attribute_model.scorer, convs), np.float32)
  unscored = np.flatnonzero(np.isnan(preds).any(axis=1))
  if unscored.size:
    where = f"{param}.{unscored[0]}"
    if attribute_model.judge == "genrm":
      raise protocol.ApiError(
          f"{where}: the GenRM judge wrote no answer about it that parses (or its pairs'"
          " prompts leave no room for scorer.judge_max_new_tokens in scorer.max_len)",
          param=where, code="not_judged")
    raise protocol.ApiError(f"{where}: too long for the attribute model to score (its"
                            " scorer.max_len)", param=where, code="context_length_exceeded")
  return preds, rewards_lib.rewards(preds, attribute_model.weights)
