"""A request's rows on the engine: checked against the limits, submitted, collected or
streamed (SSE), and cancelled when the client goes away.

A generation's choices are submitted as separate rows and their updates come back
through an asyncio queue.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from typing import AsyncIterator

import fastapi
from fastapi.responses import Response, StreamingResponse

from helpsteer_jax.inference import engine as engine_lib
from helpsteer_jax.inference import steering
from helpsteer_jax.inference.sampling import sample_seed
from helpsteer_jax.serve import protocol
from helpsteer_jax.serve.state import AppState


@dataclasses.dataclass
class Job:
  """One request's rows, ready for the engine."""

  prompt_ids: list[int]
  max_tokens: int
  temperature: float
  top_p: float
  seeds: list[int]
  stop_strings: tuple[str, ...]
  chat: bool
  echo: str = ""  # text shown before each choice's (completions' `echo`)


def job(state: AppState, req, prompt_ids: list[int], chat: bool, echo: str = "") -> Job:
  """`req`'s rows for one prompt, its sampling settings checked against the server's."""
  settings, engine = state.settings, state.engine
  state.check_model(req.model)
  if req.n > settings.max_n:
    raise protocol.ApiError(f"n={req.n} is above this server's limit {settings.max_n}",
                            param="n")
  asked = getattr(req, "max_completion_tokens", None) or req.max_tokens
  room = engine.max_length - len(prompt_ids)
  if room < 1:
    raise protocol.ApiError(
        f"the prompt has {len(prompt_ids)} tokens; this model's context length is"
        f" {engine.max_length}", param="messages" if chat else "prompt",
        code="context_length_exceeded")
  if asked is not None and asked > settings.max_tokens:
    raise protocol.ApiError(f"max_tokens={asked} is above this server's limit"
                            f" {settings.max_tokens}", param="max_tokens")
  if asked is not None and asked > room:
    raise protocol.ApiError(
        f"the prompt has {len(prompt_ids)} tokens; with max_tokens={asked} that exceeds"
        f" this model's context length {engine.max_length}", param="max_tokens",
        code="context_length_exceeded")
  # OpenAI's `seed`: the same request and seed give the same choices; choice i's own seed.
  seed = random.getrandbits(31) if req.seed is None else req.seed
  return Job(prompt_ids, min(settings.max_tokens, room) if asked is None else asked,
             settings.temperature if req.temperature is None else req.temperature,
             settings.top_p if req.top_p is None else req.top_p,
             [sample_seed(seed, i) for i in range(req.n)], req.stop_strings(), chat, echo)


def choices(jobs: list[Job]) -> list[Job]:
  """Each choice's job: prompt i's sample j is choice i * n + j (OpenAI's numbering)."""
  return [j for j in jobs for _ in j.seeds]


def prompt_tokens(jobs: list[Job]) -> int:
  return sum(len(j.prompt_ids) for j in jobs)


def submit(state: AppState, jobs: list[Job]
           ) -> tuple[asyncio.Queue, list[engine_lib.Handle | None]]:
  """Every choice's row (None for a job generating nothing); (choice, update)s arrive
  on the queue."""
  loop, updates = asyncio.get_running_loop(), asyncio.Queue()
  handles = []
  try:
    for j in jobs:
      for seed in j.seeds:
        i = len(handles)
        if j.max_tokens == 0:
          handles.append(None)
          continue
        put = lambda u, i=i: loop.call_soon_threadsafe(updates.put_nowait, (i, u))
        handles.append(state.engine.submit(engine_lib.DecodeRequest(
            prompt_ids=j.prompt_ids, max_tokens=j.max_tokens, on_update=put,
            temperature=j.temperature, top_p=j.top_p, seed=seed,
            stop_strings=j.stop_strings)))
  except RuntimeError as e:  # shutting down
    cancel(handles)
    raise protocol.ApiError(str(e), 503, kind="server_error") from None
  return updates, handles


def cancel(handles: list[engine_lib.Handle | None]) -> None:
  for h in handles:
    if h is not None:
      h.cancel()


def ended_by_server(u: engine_lib.Update) -> protocol.ApiError | None:
  """The error of a row the engine ended: 500 for a failure, 503 for a shutdown."""
  if u.finish_reason == "error":
    return protocol.ApiError(f"generation failed: {u.text}", 500, kind="server_error")
  if u.finish_reason == "abort":
    return protocol.ApiError(u.text, 503, kind="server_error", code="shutting_down")
  return None


def final_text(j: Job, u: engine_lib.Update) -> str:
  """A choice's text from its final update (raising the error of a row the engine ended)."""
  failure = ended_by_server(u)
  if failure is not None:
    raise failure
  return steering.response_text(u.text, u.finish_reason) if j.chat else u.text


async def collect(state: AppState, jobs: list[Job], request: fastapi.Request
                  ) -> list[engine_lib.Update] | None:
  """Every choice's final update (None if the client went away: its rows are
  cancelled as soon as the server hears of it)."""
  updates, handles = submit(state, jobs)
  finals = {i: engine_lib.Update("", 0, "length") for i, h in enumerate(handles) if h is None}
  gone = asyncio.ensure_future(_disconnect(request))
  try:
    while len(finals) < len(handles):
      update = asyncio.ensure_future(updates.get())
      await asyncio.wait((update, gone), return_when=asyncio.FIRST_COMPLETED)
      if not update.done():
        update.cancel()
        return None
      i, u = update.result()
      if u.finish_reason:
        finals[i] = u
  finally:
    gone.cancel()
    cancel(handles)
  return [finals[i] for i in range(len(handles))]


def streamed(state: AppState, req, jobs: list[Job]) -> Response:
  """The server-sent events of `jobs`' choices (`req.stream_options` asks for usage)."""
  include = bool(req.stream_options and req.stream_options.include_usage)
  return StreamingResponse(_stream(state, jobs, include), media_type="text/event-stream")


async def _stream(state: AppState, jobs: list[Job], include_usage: bool
                  ) -> AsyncIterator[str]:
  chat = jobs[0].chat
  writer = protocol.ChunkWriter(state.settings.model_name, chat)
  updates, handles = submit(state, jobs)
  of = choices(jobs)
  shown = [""] * len(handles)
  done, tokens = 0, 0
  try:
    for i, (j, h) in enumerate(zip(of, handles)):
      if chat:
        yield _event(writer.chunk(i, "", role=True))
      if j.echo:
        yield _event(writer.chunk(i, j.echo))
      if h is None:
        yield _event(writer.chunk(i, "", "length"))
        done += 1
    while done < len(handles):
      i, u = await updates.get()
      j = of[i]
      failure = ended_by_server(u)
      if failure is not None:
        yield _event(failure.body())
        yield "data: [DONE]\n\n"
        return
      delta = u.delta
      if u.finish_reason:
        text = final_text(j, u)
        delta = text[len(shown[i]):]
        done, tokens = done + 1, tokens + u.completion_tokens
      shown[i] += delta
      if delta:
        yield _event(writer.chunk(i, delta))
      if u.finish_reason:
        yield _event(writer.chunk(i, None if j.chat else "", u.finish_reason))
    if include_usage:
      yield _event(writer.chunk(None, None, usage_=protocol.usage(prompt_tokens(jobs),
                                                                  tokens)))
    yield "data: [DONE]\n\n"
  finally:  # also when the client went away: free its rows
    cancel(handles)


async def _disconnect(request: fastapi.Request) -> None:
  """Returns when the client has gone away (the body has been read already)."""
  while (await request.receive())["type"] != "http.disconnect":
    pass


def _event(data: dict) -> str:
  return f"data: {json.dumps(data)}\n\n"
