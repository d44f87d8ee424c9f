"""/v1/rewards: the attribute model's predictions and weighted reward per conversation."""

from __future__ import annotations

import asyncio
import math

import fastapi
import numpy as np

from helpsteer_jax.data import template
from helpsteer_jax.scoring import rewards as rewards_lib
from helpsteer_jax.serve import body, openapi, protocol
from helpsteer_jax.serve import state as state_lib

router = fastapi.APIRouter()


@openapi.post(router, "/v1/rewards", protocol.RewardRequest, 404)
async def rewards(request: fastapi.Request):
  state = state_lib.of(request)
  attribute_model = state.attribute_model
  req = await body.read(request, protocol.RewardRequest)
  if req.model is not None:
    state.check_model(req.model)
  if attribute_model is None:
    raise protocol.ApiError("this server has no attribute model: start it with"
                            " --config.scorer.source=<attribute_model workdir>", 404,
                            code="not_found")
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
    try:
      convs = [template.parse_regression_text(text) for text in req.texts]
    except ValueError as e:
      raise protocol.ApiError(f"texts: {e}", param="texts") from None
  preds = await asyncio.to_thread(attribute_model.scorer, convs)
  scored = [None if np.isnan(p).any() else p for p in preds]
  rewards_ = [None if p is None else float(rewards_lib.rewards(p[None], weights)[0])
              for p in scored]
  if not all(r is None or math.isfinite(r) for r in rewards_):
    raise protocol.ApiError("weights: the weighted reward overflows; give smaller weights",
                            param="weights")
  return {"object": "list", "model": state.settings.model_name,
          "data": protocol.reward_rows(scored, rewards_)}
