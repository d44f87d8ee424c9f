"""Multi-turn rollouts: the policy answers every user turn of a prompt, in order.

A prompt's request holds its first user turn and the user turns that follow
(`Request.follow_ups`: MT-Bench's second questions; HelpSteer2's multi-turn
contexts through `dialogue`, which leaves the dataset's own assistant turns
out). The first answers are sampled exactly as single-turn rollouts (the same
seeds: a prompt without follow-ups draws the same completions). Each later
turn continues every completion's own token row: the answer's tokens as
sampled, then the text that makes the row read as the SteerLM template writes
the conversation (the turn end the answer's stop left, the next user turn, the
assistant header with the requested label: `template.follow_up_text`), encoded
once and appended. So the row the update reads is, token for token, the
context each answer was sampled from: earlier answers are never re-tokenized.

The completion region of a row is everything after the first prompt
(`RLSettings.completion_width`); `mask` is 1 on the policy's own tokens only,
so the loss, the KL and the entropy cover nothing the user wrote, and
`finished` says every answer ended with a stop. `rollout.multi_turn_reward`:
"final" scores the last answer with the whole conversation as its context;
"each" scores every answer in its own context and averages the predictions
(for the weighted reward: the mean of the answers' rewards).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from helpsteer_jax.data import template
from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.inference import sample_score, steering
from helpsteer_jax.inference.engine import DecodeRequest, Engine, Output
from helpsteer_jax.inference.sampling import SamplingConfig, sample_seed
from helpsteer_jax.rl.rollout import Prompt, Rollouts
from helpsteer_jax.scoring.scorer import Scorer, predict


def dialogue(request: steering.Request) -> steering.Request:
  """`request` as a conversation for the policy to hold: its first user turn, the later
  ones as follow-ups (a history's assistant turns, another model's answers, left out)."""
  conv = request.conversation
  users = [t.text for t in conv.turns if t.role == conv.mask_role]
  if len(users) <= 1:
    return request
  first = dataclasses.replace(conv, turns=(Turn(conv.mask_role, users[0]),))
  return dataclasses.replace(request, conversation=first,
                             follow_ups=tuple(users[1:]) + request.follow_ups)


def encode(text: str, tokenizer: Any) -> list[int]:
  """The ids of text appended to a row (no BOS)."""
  return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def follow_up_tokens(request: steering.Request, tokenizer: Any, max_new_tokens: int) -> int:
  """The most tokens `request`'s follow-ups add to a row after the first answer: each
  one's text (after an answer cut at the limit) and an answer of `max_new_tokens`."""
  return sum(len(encode(template.END_OF_TURN + template.follow_up_text(u, request.attributes),
                        tokenizer)) + max_new_tokens for u in request.follow_ups)


def continuation(answer: Output, user: str, attributes: dict, tokenizer: Any,
                 eos_ids: frozenset[int]) -> str:
  """The text to append to `answer`'s tokens when `user` speaks next: what the template
  writes after the answer's text, less what the sampled tokens already hold (the turn
  end and turn marker a stop leaves); after another stop (EOS, a stop string), all of it."""
  ids = answer.token_ids
  ids = ids[:-1] if ids and ids[-1] in eos_ids else ids
  sampled = tokenizer.decode(ids, skip_special_tokens=False)
  after = template.END_OF_TURN + template.follow_up_text(user, attributes)
  want = steering.response_text(answer.text, answer.finish_reason) + after
  return want[len(sampled):] if want.startswith(sampled) else after


@dataclasses.dataclass
class _Row:
  """One completion's conversation so far: the tokens after its first prompt."""
  ids: list[int]
  mask: list[float]
  logp: list[float]
  answers: list[str]
  last: Output
  stopped: bool = True  # every answer so far ended with a stop
  ended: bool = False   # no room for the next turn

  def add(self, out: Output) -> None:
    n = len(out.token_ids)
    self.ids += out.token_ids
    self.mask += [1.0] * n
    self.logp += list(out.logprobs[:n])
    self.answers.append(steering.response_text(out.text, out.finish_reason))
    self.last = out
    self.stopped = self.stopped and out.finish_reason == "stop"


def sample(engine: Engine, prompts: Sequence[Prompt], k: int, max_new_tokens: int,
           width: int, sampling: SamplingConfig, *, seed: int = 0, step: int = 0,
           first: int = 0, pad_id: int = 0) -> Rollouts:
  """K conversations per prompt, each answering the prompt's user turns in order, as
  `Rollouts` whose completion region [B, width] holds every turn after the first prompt.
  Answer t >= 1 of completion j of prompt i samples with seed
  `sample_seed(seed, step, first + i, j, t)`; the first answers with single-turn's."""
  keys = [(seed, step, first + i) for i in range(len(prompts))]
  outputs = sample_score.sample(engine, [p.ids for p in prompts], k, max_new_tokens,
                                sampling, keys)
  rows = [_Row([], [], [], [], o) for o in outputs]
  for row, out in zip(rows, outputs):
    row.add(out)
  for t in range(1, 1 + max(len(p.request.follow_ups) for p in prompts)):
    live, requests = [], []
    for b, row in enumerate(rows):
      p = prompts[b // k]
      if len(p.request.follow_ups) < t or row.ended:
        continue
      extra = encode(continuation(row.last, p.request.follow_ups[t - 1],
                                  p.request.attributes, engine.tokenizer, engine.eos_ids),
                     engine.tokenizer)
      room = min(max_new_tokens, width - len(row.ids) - len(extra),
                 engine.max_length - len(p.ids) - len(row.ids) - len(extra))
      if room < 1:  # the prompt filter's bound makes this rare; every process agrees
        row.ended = True
        continue
      row.ids += extra
      row.mask += [0.0] * len(extra)
      row.logp += [0.0] * len(extra)
      requests.append(DecodeRequest(
          p.ids + row.ids, room, temperature=sampling.temperature, top_p=sampling.top_p,
          top_k=sampling.top_k, seed=sample_seed(*keys[b // k], b % k, t)))
      live.append(b)
    for b, out in zip(live, engine.generate(requests) if requests else []):
      rows[b].add(out)
  tokens = np.full((len(rows), width), pad_id, np.int32)
  mask = np.zeros((len(rows), width), np.float32)
  logp = np.zeros((len(rows), width), np.float32)
  for b, row in enumerate(rows):
    n = len(row.ids)
    tokens[b, :n], mask[b, :n], logp[b, :n] = row.ids, row.mask, row.logp
  finished = np.asarray([row.stopped and not row.ended for row in rows])
  return Rollouts([list(p.ids) for p in prompts], k, tokens, mask, logp, finished,
                  [row.last.text for row in rows], [row.answers for row in rows])


def conversations(r: Rollouts, prompts: Sequence[Prompt], reward: str
                  ) -> tuple[list[Conversation], np.ndarray]:
  """The conversations the scorer reads ("final": one per completion, ending at its last
  answer; "each": one per answer) and the completion [N] each belongs to."""
  convs, owner = [], []
  for b, answers in enumerate(r.answers):
    request = prompts[b // r.k].request
    conv = request.conversation
    label = template.label_string(request.attributes)
    turns = list(conv.turns)
    for j, answer in enumerate(answers):
      turns.append(Turn("Assistant", answer, label=label))
      if reward == "each" or j == len(answers) - 1:
        convs.append(dataclasses.replace(conv, turns=tuple(turns)))
        owner.append(b)
      if j < len(request.follow_ups):
        turns.append(Turn(conv.mask_role, request.follow_ups[j]))
  return convs, np.asarray(owner, np.int64)


def score(r: Rollouts, prompts: Sequence[Prompt], scorer: Scorer, reward: str) -> np.ndarray:
  """[B, 9] predictions: of each completion's last answer, or the mean over its answers."""
  convs, owner = conversations(r, prompts, reward)
  preds = predict(convs, scorer)
  counts = np.bincount(owner, minlength=len(r.answers)).astype(np.float64)
  sums = np.zeros((len(r.answers), preds.shape[1]), np.float64)
  np.add.at(sums, owner, preds)
  return (sums / counts[:, None]).astype(np.float32)


def sample_and_score(engine: Engine, prompts: Sequence[Prompt], k: int, max_new_tokens: int,
                     scorer: Scorer, *, width: int, reward: str = "final",
                     temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                     seed: int = 0, step: int = 0, pad_id: int = 0,
                     on_sampled: Callable[[Rollouts], Any] | None = None, first: int = 0
                     ) -> tuple[Rollouts, np.ndarray, Any]:
  """`rollout.sample_and_score` for conversations: `sample`, then `on_sampled(rollouts)`
  (before scoring), then `score`."""
  sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
  r = sample(engine, prompts, k, max_new_tokens, width, sampling, seed=seed, step=step,
             first=first, pad_id=pad_id)
  done = None if on_sampled is None else on_sampled(r)
  return r, score(r, prompts, scorer, reward), done
