"""Time between tokens of running streams while a wave of newcomers arrives.

`serve_vs_vllm.py`'s wave phase, the same on both servers: `running` greedy chats
are streamed (each asked for `2 * max_tokens` tokens, so they outlast the wave);
once every one of them has streamed tokens, `newcomers` more chats are sent at
once; when the newcomers have finished, the running streams are read to their
end. Each streamed event's arrival time is recorded with the tokens it carried
(the export's tokenizer's count of the text so far, less the count before it; at
least one: the OpenAI chunk format carries no token count), and an event's gap
to the previous one is spread evenly over its tokens (a server that sends eight
tokens per event after a gap of eight steps has eight inter-token times of one
step). The times from the wave's start until the last newcomer finished are the
wave's; those before it, the same streams' baseline.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Callable

import numpy as np
import openai

HEADER = ["dtype", "running + newcomers", "ours TBT median / p99 (ms)", "ours p99 / median",
          "ours median before the wave (ms)", "vLLM TBT median / p99 (ms)",
          "vLLM p99 / median", "vLLM median before the wave (ms)"]


def _stream(client: openai.OpenAI, model: str, prompt: str, max_tokens: int, extra: dict,
            events: list[tuple[float, str]], started: threading.Event) -> None:
  """Streams one chat, appending (arrival time, text so far) per event with content."""
  text = ""
  for chunk in client.chat.completions.create(
      model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
      temperature=0, stream=True, extra_body=extra or None):
    delta = chunk.choices[0].delta.content if chunk.choices else None
    if delta:
      text += delta
      events.append((time.perf_counter(), text))
      if len(events) >= 2:
        started.set()
  started.set()


def token_gaps(events: list[tuple[float, str]], count: Callable[[str], int]
               ) -> list[tuple[float, float]]:
  """(arrival time, seconds per token) for each token of a stream after its first event."""
  out, before = [], count(events[0][1]) if events else 0
  for (t0, _), (t1, text) in zip(events, events[1:]):
    tokens = max(1, count(text) - before)
    before = count(text)
    out += [(t1, (t1 - t0) / tokens)] * tokens
  return out


def wave(client: openai.OpenAI, model: str, prompts: list[str], running: int, newcomers: int,
         max_tokens: int, extra: Callable[[int], dict], count: Callable[[str], int]) -> dict:
  """The wave phase's figures: the running streams' time between tokens during the wave
  (median, p99, their ratio) and before it (median). `extra(n)`: the server's extra body
  for `n` tokens."""
  events = [[] for _ in range(running)]
  started = [threading.Event() for _ in range(running)]
  with concurrent.futures.ThreadPoolExecutor(running + newcomers) as pool:
    streams = [pool.submit(_stream, client, model, prompts[i], 2 * max_tokens,
                           extra(2 * max_tokens), events[i], started[i])
               for i in range(running)]
    for s in started:
      s.wait()
    start = time.perf_counter()
    asked = [pool.submit(client.chat.completions.create, model=model, messages=[
        {"role": "user", "content": p}], max_tokens=max_tokens, temperature=0,
        extra_body=extra(max_tokens) or None) for p in prompts[running:running + newcomers]]
    for a in asked:
      a.result()
    end = time.perf_counter()
    for s in streams:
      s.result()
  gaps = [g for e in events for g in token_gaps(e, count)]
  during = np.asarray([s for t, s in gaps if start < t <= end])
  before = np.asarray([s for t, s in gaps if t <= start])
  median, p99 = float(np.median(during)), float(np.percentile(during, 99))
  return {"running": running, "newcomers": newcomers, "wave_seconds": round(end - start, 3),
          "tbt_median_s": median, "tbt_p99_s": p99, "tbt_p99_over_median": p99 / median,
          "tbt_median_before_s": float(np.median(before)) if before.size else None,
          "tokens_during": int(during.size)}


def table_rows(records: list[dict]) -> list[list[str]]:
  """The docs table: one line per dtype, ours next to vLLM's."""
  by_key = {(r["server"], r["dtype"]): r for r in records}
  out = []
  for dtype in dict.fromkeys(r["dtype"] for r in records):
    line = [dtype, "-"]
    for server in ("ours", "vllm"):
      r = by_key.get((server, dtype))
      if r is None:
        line += ["-", "-", "-"]
        continue
      line[1] = f"{r['running']} + {r['newcomers']}"
      before = r["tbt_median_before_s"]
      line += [f"{r['tbt_median_s'] * 1e3:.0f} / {r['tbt_p99_s'] * 1e3:.0f}",
               f"{r['tbt_p99_over_median']:.2f}x",
               "-" if before is None else f"{before * 1e3:.0f}"]
    out.append(line)
  return out
