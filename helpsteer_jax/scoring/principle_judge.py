"""A principle judge (RLBFF) as a policy's reward: `scorer.judge=principle`.

The reward of a response is log p(" Yes") - log p(" No") at the judge's verdict token
for a principle: `scorer.principle`, or the principle in the conversation's reference.
The judge's input is its prompt (`judges.principle.judge_prompt`: the conversation
before the response as a transcript, the response, the principle) as the user turn of
the SteerLM prompt format with no attribute label, the way `rl:principle` trains it,
followed by its answer's opening `Final Judgement:` (and the verdicts' shared leading
tokens, if the tokenizer has any).

- `scorer.judge_max_new_tokens=0`: nothing before the `Final Judgement:`, one forward
  pass per response: a deterministic function of the response, no generation;
- `> 0` (RLBFF's judge is a reasoning model): the judge first reasons, greedily, up to
  that many tokens, stopped at its own `Final Judgement:` or its end of turn; the input
  is then the prompt, that reasoning (cut where the stop begins) and
  `continued(reasoning)`'s `Final Judgement:` (`inference.principle_reasoning` on the
  mesh; two requests to a server). A reasoning cut by the budget, or ended without a
  judgement, is continued the same way: the judge is made to judge after what it wrote.

Both log-probabilities are exact (a forward pass over the full vocabulary, not a top 20)
on the mesh.

- a path (an HF causal-LM directory or a run; `load.model.load_model(DECODE)`, shapes
  from `scorer.model` / the run): `LocalJudge`, batched and sharded like the attribute
  model (length buckets, `frozen_pass.FrozenPass`), the same rows on every process;
- a server's base URL: `HttpJudge`, `POST <url>/completions` with `max_tokens=1` and
  `logprobs=20` (the project's server and vLLM return the top alternatives by token
  text); a verdict missing from them scores `MISSING_REWARD` (NeMo-RL's RLHF
  environment's 0), asked by process 0 (`PrimaryScorer`). With reasoning, a first
  request generates it (`max_tokens=judge_max_new_tokens`, greedy,
  `stop=["Final Judgement:"]`) and the second is the same one-token request on the
  prompt + reasoning + `Final Judgement:`.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from helpsteer_jax import choices, frozen_pass
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.data import template
from helpsteer_jax.data.features.tokenize import tokenize_pieces
from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.judges import principle
from helpsteer_jax.models import builder
from helpsteer_jax.models.reward import last_token_index
from helpsteer_jax.runtime import Runtime
from helpsteer_jax.scoring.judge_budget import Budget
from helpsteer_jax.scoring.model import BucketedPass, length_batches, length_buckets, pad_batch
from helpsteer_jax.scoring.remote import API_KEY_ENV
from helpsteer_jax.scoring.scorer import reward_rows

JUDGE = choices.PRINCIPLE_JUDGE  # scorer.judge
MISSING_REWARD = 0.0  # a served judge's reward when a verdict is not in its top 20


def judge_prompt_text(conv: Conversation, fallback: str) -> str:
  """The judge's prompt for `conv` (ending in the response to judge), rendered up to where
  its answer starts; the principle from the reference, else `fallback`."""
  text = (conv.reference or {}).get(principle.PRINCIPLE_KEY) or fallback
  if not text:
    raise ConfigError(f"conversation {conv.source or ''} names no principle: set"
                      " --config.scorer.principle (e.g. 'The response is accurate.') or"
                      " give the prompt rows a reference with a principle")
  return _rendered(conv, text)


def _rendered(conv: Conversation, text: str) -> str:
  """The judge's prompt for `conv` and the principle `text`, up to its answer."""
  *context, response = conv.turns
  # The policy's default system prompt says nothing about the task: left out.
  system = "" if conv.system == template.DEFAULT_SYSTEM else conv.system
  request = principle.judge_prompt(Conversation(system, tuple(context)), response.text, text)
  judge = Conversation(template.DEFAULT_SYSTEM, (Turn("User", request),))
  return template.generation_prompt(judge, {})


def continued(reasoning: str) -> str:
  """The judge's answer from `reasoning` (its text before its own `Final Judgement:`, or
  all it wrote when it stopped without one) to its `Final Judgement:`. The judgement
  follows the reasoning as written when that ends in white space (or is empty), as a
  judge writes it; after a newline otherwise (a reasoning cut by the token budget)."""
  sep = "" if not reasoning or reasoning[-1].isspace() else "\n"
  return reasoning + sep + principle.JUDGEMENT


def judge_text(conv: Conversation, fallback: str, reasoning: str = "") -> str:
  """The judge's input for `conv` through its `Final Judgement:`, after `reasoning`."""
  return judge_prompt_text(conv, fallback) + continued(reasoning)


def encode(text: str, tokenizer: Any, add_bos: bool) -> list[int]:
  """`text`'s ids as one call of the tokenizer (the prompt encoder's rule)."""
  return tokenize_pieces([template.Piece(text, False)], tokenizer, add_bos=add_bos).ids.tolist()


def verdicts_of(tokenizer: Any) -> principle.VerdictTokens:
  """The verdict tokens in `tokenizer`'s ids."""
  return principle.verdict_tokens(lambda s: tokenizer(s, add_special_tokens=False)["input_ids"])


def bare_tokens(tokenizer: Any, add_bos: bool, reasons: bool) -> int:
  """The tokens of the judge's input with no conversation and no principle in it, its
  fixed text alone, through the verdicts' shared leading ids (after a reasoning cut by
  its budget when the judge `reasons`): what no judge input is shorter than."""
  bare = Conversation("", (Turn("User", ""), Turn("Assistant", "")))
  tail = "\n" + principle.JUDGEMENT if reasons else continued("")
  return (len(encode(_rendered(bare, "") + tail, tokenizer, add_bos))
          + len(verdicts_of(tokenizer).prefix))


class LocalJudge(BucketedPass):
  """A causal LM judge on the mesh: conversations -> [n, 9] reward rows (NaN: the input
  is longer than `max_len`, its `budget`)."""

  def __init__(self, model: nnx.Module, rt: Runtime, tokenizer: Any, *, batch_size: int,
               max_len: int, add_bos: bool = True, principle_text: str = ""):
    sharding_lib.check_batch(batch_size, rt.mesh, rt.rules, "the scoring batch")
    self.tokenizer, self.add_bos, self.principle = tokenizer, add_bos, principle_text
    self.tokens = verdicts_of(tokenizer)
    self.batch_size, self.buckets = int(batch_size), length_buckets(max_len)
    self.budget = Budget(int(max_len), 0)
    self.local_rows = 0
    self._host_rows = sharding_lib.host_local_batch_slice(batch_size)
    self._lock = threading.Lock()
    graphdef, self.params = nnx.split(model, nnx.Param)
    shardings = builder.state_shardings(self.params, rt.mesh, rt.rules)
    rules, pair = rt.rules, jnp.asarray([self.tokens.yes, self.tokens.no])

    def verdicts(params, batch):
      """[B, 2] fp32: log p(yes), log p(no) after each row's last real token."""
      with sharding_lib.axis_rules(rules):
        decoder = nnx.merge(graphdef, params)
        hidden = decoder(batch["tokens"], batch["positions"], batch["segment_ids"])
        last = last_token_index(batch["segment_ids"])
        picked = jnp.take_along_axis(hidden, last[:, None, None], axis=1)
        logp = jax.nn.log_softmax(decoder.logits(picked)[:, 0], axis=-1)
        return logp[:, pair]

    self._pass = frozen_pass.FrozenPass(
        verdicts, rt.mesh, NamedSharding(rt.mesh, sharding_lib.batch_spec(rules)),
        self.batch_size, (shardings,))

  def encode(self, text: str) -> list[int]:
    """`text`'s ids as one call of the tokenizer (the prompt encoder's rule)."""
    return encode(text, self.tokenizer, self.add_bos)

  def ids(self, text: str) -> list[int]:
    """The judge's input ids for `text` (through its `Final Judgement:`), then the
    verdicts' shared leading ids."""
    return self.encode(text) + list(self.tokens.prefix)

  def prompt_tokens(self, group: Sequence[Conversation]) -> np.ndarray:
    """[len(group)] each conversation's judge input in tokens."""
    return np.asarray([len(self.ids(judge_text(c, self.principle))) for c in group])

  def verdicts(self, texts: Sequence[str]) -> np.ndarray:
    """[n, 2] float64 (log p(yes), log p(no)) after each judge input `texts[i]`; NaN rows
    for inputs over `max_len`."""
    seqs = [self.ids(t) for t in texts]
    out = np.full((len(texts), 2), np.nan)
    kept = [i for i, s in enumerate(seqs) if len(s) <= self.buckets[-1]]
    with self._lock:
      for idx in length_batches([len(seqs[i]) for i in kept], self.batch_size):
        rows = [kept[i] for i in idx]
        length = next(b for b in self.buckets if b >= max(len(seqs[r]) for r in rows))
        pending = self._pass.dispatch((self.params,),
                                      pad_batch([seqs[r] for r in rows], len(rows), length))
        out[rows] = frozen_pass.FrozenPass.fetch([pending])
        self.local_rows += len(range(len(rows))[self._host_rows])
    return out

  def rewards(self, texts: Sequence[str]) -> np.ndarray:
    """[n, 9] reward rows of the judge inputs `texts`."""
    v = self.verdicts(texts)
    return reward_rows(v[:, 0] - v[:, 1])

  def __call__(self, convs: Sequence[Conversation]) -> np.ndarray:
    return self.rewards([judge_text(c, self.principle) for c in convs])


class HttpJudge:
  """A served judge over `/v1/completions`: conversations -> [n, 9] reward rows; with
  `max_new_tokens` > 0 a first request generates each judge's reasoning."""

  def __init__(self, url: str, principle_text: str = "", batch_size: int = 64,
               timeout: float = 600.0, max_new_tokens: int = 0):
    import httpx  # the serve extra: missing, it fails here rather than at the first call
    self._httpx, self.principle = httpx, principle_text
    key = os.environ.get(API_KEY_ENV, "")
    self.url = str(url).rstrip("/") + "/completions"
    self.headers = {"Authorization": f"Bearer {key}"} if key else {}
    self.batch_size, self.timeout = max(int(batch_size), 1), timeout
    self.max_new_tokens = int(max_new_tokens)

  def __call__(self, convs: Sequence[Conversation]) -> np.ndarray:
    prompts = [judge_prompt_text(c, self.principle) for c in convs]
    rewards = []
    with self._httpx.Client(timeout=self.timeout, headers=self.headers) as client:
      for lo in range(0, len(prompts), self.batch_size):
        batch = prompts[lo:lo + self.batch_size]
        reasoning = ([c["text"] for c in self._post(client, batch, {
            "max_tokens": self.max_new_tokens, "stop": [principle.JUDGEMENT]})]
                     if self.max_new_tokens > 0 else [""] * len(batch))
        choices = self._post(client, [p + continued(r) for p, r in zip(batch, reasoning)],
                             {"max_tokens": 1, "logprobs": 20})
        rewards += [served_reward((c.get("logprobs") or {}).get("top_logprobs") or [{}])
                    for c in choices]
    return reward_rows(rewards)

  def _post(self, client, texts: list[str], settings: dict) -> list[dict]:
    """The choices of one greedy completions request for `texts`, in their order."""
    response = client.post(self.url, json={"prompt": texts, "temperature": 0.0, **settings})
    if response.status_code != 200:
      raise ConfigError(f"the principle judge at {self.url} answered"
                        f" {response.status_code}: {response.text[:500]}")
    return sorted(response.json()["choices"], key=lambda c: c["index"])


def served_reward(top_logprobs: list[dict]) -> float:
  """log p(" Yes") - log p(" No") from a completion's first token's top alternatives
  (token text -> log-prob), `MISSING_REWARD` when either is not among them."""
  first = top_logprobs[0] or {}
  yes, no = first.get(principle.YES, -math.inf), first.get(principle.NO, -math.inf)
  return yes - no if math.isfinite(yes) and math.isfinite(no) else MISSING_REWARD
