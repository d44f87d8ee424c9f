"""The generating routes: /v1/chat/completions (steered by `attributes`; a GenRM
comparison in NeMo-RL's shape, `judge_chat`) and the legacy /v1/completions (prompt
forms, echo, logprobs)."""

from __future__ import annotations

import asyncio

import fastapi
from absl import logging
from fastapi.responses import JSONResponse, Response

from helpsteer_jax.data import template
from helpsteer_jax.serve import body, jobs, judge_chat, openapi, protocol
from helpsteer_jax.serve import completions as completions_lib
from helpsteer_jax.serve import state as state_lib

router = fastapi.APIRouter()


@openapi.post(router, "/v1/chat/completions", protocol.ChatRequest)
async def chat(request: fastapi.Request):
  state = state_lib.of(request)
  settings = state.settings
  req = await body.read(request, protocol.ChatRequest)
  given, param = req.requested_attributes()
  attributes = protocol.attributes(given, settings.attributes, param)
  label = template.label_string(attributes)
  judged = judge_chat.judge_prompt(req.messages, settings.judge_guidelines)
  if judged is not None and req.stream:
    raise protocol.ApiError("stream: a GenRM comparison is answered whole (its parsed scores"
                            " follow the text)", param="stream")
  messages = req.messages if judged is None else [protocol.Message(role="user",
                                                                    content=judged)]

  def render() -> list[int]:
    conv = protocol.conversation(messages, label, settings.system)
    return state.policy.encode(template.generation_prompt(conv, attributes))

  j = jobs.job(state, req, await asyncio.to_thread(render), chat=True)  # off the event loop
  logging.info("chat: stream=%s n=%d prompt_tokens=%d max_tokens=%d attributes=%s",
               req.stream, req.n, len(j.prompt_ids), j.max_tokens, label)
  if req.stream:
    return jobs.streamed(state, req, [j])
  finals = await jobs.collect(state, [j], request)
  if finals is None:
    return Response(status_code=499)  # the client closed the connection
  texts = [(jobs.final_text(j, u), u.finish_reason) for u in finals]
  if judged is not None:
    texts = [(judge_chat.answer_text(text), finish) for text, finish in texts]
  return JSONResponse(protocol.chat_response(settings.model_name, texts, len(j.prompt_ids),
                                             sum(u.completion_tokens for u in finals)))


@openapi.post(router, "/v1/completions", protocol.CompletionRequest)
async def completions(request: fastapi.Request):
  state = state_lib.of(request)
  policy = state.policy
  req = await body.read(request, protocol.CompletionRequest)
  state.check_model(req.model)
  if req.max_tokens == 0 and not req.echo:
    raise protocol.ApiError("max_tokens=0 generates nothing: give echo=true to score the"
                            " prompt, or max_tokens >= 1", param="max_tokens")
  if req.stream and req.logprobs is not None:
    raise protocol.ApiError("logprobs with stream is not supported", param="logprobs")
  prompts = await asyncio.to_thread(completions_lib.prompts, req.prompt,
                                    policy.encode_plain, policy.decode, state.vocab)
  batch = [jobs.job(state, req, ids, chat=False, echo=text if req.echo else "")
           for ids, text in prompts]
  logging.info("completions: stream=%s prompts=%d n=%d prompt_tokens=%d max_tokens=%d"
               " echo=%s logprobs=%s", req.stream, len(batch), req.n, jobs.prompt_tokens(batch),
               batch[0].max_tokens, req.echo, req.logprobs)
  if req.stream:
    return jobs.streamed(state, req, batch)
  scores = [None] * len(batch)
  if req.echo and req.logprobs is not None:
    try:
      scores = [asyncio.wrap_future(state.engine.score(j.prompt_ids)) for j in batch]
    except RuntimeError as e:  # shutting down
      raise protocol.ApiError(str(e), 503, kind="server_error") from None
  finals = await jobs.collect(state, batch, request)
  scores = [s if s is None else await s for s in scores]
  if finals is None:
    return Response(status_code=499)
  of, score_of = jobs.choices(batch), [s for s, j in zip(scores, batch) for _ in j.seeds]
  texts = [(j.echo + jobs.final_text(j, u), u.finish_reason) for j, u in zip(of, finals)]
  logprobs = None
  if req.logprobs is not None:
    logprobs = [completions_lib.logprobs_object(
        req.logprobs, state.token_text,
        ([(j.prompt_ids, s)] if req.echo else []) + ([(u.token_ids, u.raw)] if u.raw else []))
        for j, u, s in zip(of, finals, score_of)]
  return JSONResponse(protocol.completion_response(
      state.settings.model_name, texts, jobs.prompt_tokens(batch),
      sum(u.completion_tokens for u in finals), logprobs))
