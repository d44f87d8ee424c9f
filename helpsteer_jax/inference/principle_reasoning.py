"""A principle judge (RLBFF) that reasons before its verdict, on the mesh:
`scorer.judge=principle` with `scorer.judge_max_new_tokens` > 0.

RLBFF's judge is a reasoning model: it writes its analysis, then `Final Judgement: Yes`
or `No`. Here it generates greedily on the engine's batch API (its own `Engine`, the
judge's weights loaded DECODE) up to `judge_max_new_tokens`, each row stopped at its
own `Final Judgement:`, its end of turn or its budget; the reward is then read by the
judge's one forward pass (`scoring.principle_judge.LocalJudge`) over the prompt, that
reasoning and `Final Judgement:` (`principle_judge.continued`): log p(" Yes") -
log p(" No") over the full vocabulary. The engine also reports each generated token's
top 20 log-probabilities, but reading the verdict there would need one more generated
token and leave the verdicts that are not among the top 20 without a value (the served
form's `MISSING_REWARD`); the pass costs one prefill per response next to the decoding.
The pass's input is the text tokenized in one call, as the server's second request is,
so a local and a served judge score the same input.

A prompt's budget is cut to what its row leaves under `scorer.max_len` (with the
judgement's tokens); a prompt that leaves none is judged without reasoning. The judge's
`budget` (`scoring.judge_budget`) is max_len - judge_max_new_tokens: a task none of whose
prompts fits it (every reasoning cut) is refused before anything compiles. Greedy
decoding and the pass are SPMD over the mesh: every process gets the same rows. The
engine holds its own per-layer copy of the judge's layers and a KV cache of
`scorer.batch_size` rows of `scorer.max_len` tokens beside the pass's weights.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import numpy as np
from flax import nnx

from helpsteer_jax.data.records import Conversation
from helpsteer_jax.inference.engine import DecodeRequest
from helpsteer_jax.inference.generator import make_engine
from helpsteer_jax.judges import principle
from helpsteer_jax.runtime import Runtime
from helpsteer_jax.scoring import principle_judge
from helpsteer_jax.scoring.judge_budget import Budget
from helpsteer_jax.scoring.principle_judge import LocalJudge


class ReasoningJudge:
  """Conversations -> [n, 9] reward rows of a judge that reasons first (`local_rows`,
  `warm_up` as `LocalJudge`'s)."""

  def __init__(self, judge: LocalJudge, model: nnx.Module, rt: Runtime, max_new_tokens: int):
    if max_new_tokens < 1:
      raise ValueError(f"max_new_tokens={max_new_tokens}: a reasoning judge generates")
    tok = judge.tokenizer
    self.judge, self.max_new_tokens = judge, int(max_new_tokens)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    self.engine = make_engine(model, rt.mesh, tok, rules=rt.rules, max_batch=judge.batch_size,
                              max_length=judge.buckets[-1], pad_id=int(pad))
    # What the judgement adds after a reasoning cut by the budget.
    self._tail = len(judge.ids("\n" + principle.JUDGEMENT)) - len(judge.encode(""))
    self._lock = threading.Lock()
    # A prompt within it reasons its full `max_new_tokens`; a longer one reasons less.
    self.budget = Budget(self.engine.max_length, self.max_new_tokens)

  @property
  def local_rows(self) -> int:
    return self.judge.local_rows

  def prompt_tokens(self, group: Sequence[Conversation]) -> np.ndarray:
    """[len(group)] each conversation's judge prompt and judgement in tokens."""
    return np.asarray([len(self.judge.encode(principle_judge.judge_prompt_text(
        c, self.judge.principle))) + self._tail for c in group])

  @property
  def warm_up_programs(self) -> int:
    return self.judge.warm_up_programs + self.engine.warm_up_programs

  @property
  def compiled_variants(self) -> int:
    return self.judge.compiled_variants + self.engine.compiled_variants

  def warm_up(self, on_step: Callable[[], None] = lambda: None) -> None:
    """The pass's length buckets and the engine's programs (a server compiles nothing),
    `on_step()` after each."""
    self.judge.warm_up(on_step)
    self.engine.warm_up(on_step)

  def reasoning(self, prompts: Sequence[str]) -> list[str]:
    """Each judge prompt's greedy reasoning: the text before its `Final Judgement:` (or
    all it wrote when it ends its turn or its budget first)."""
    out, requests, rows = [""] * len(prompts), [], []
    for i, text in enumerate(prompts):
      ids = self.judge.encode(text)
      budget = min(self.max_new_tokens, self.engine.max_length - len(ids) - self._tail)
      if budget >= 1:
        requests.append(DecodeRequest(ids, budget, stop_strings=(principle.JUDGEMENT,)))
        rows.append(i)
    for i, output in zip(rows, self.engine.generate(requests) if requests else []):
      out[i] = output.text
    return out

  def __call__(self, convs: Sequence[Conversation]) -> np.ndarray:
    prompts = [principle_judge.judge_prompt_text(c, self.judge.principle) for c in convs]
    with self._lock:  # one batch at a time on the engine (a server's concurrent requests)
      reasoning = self.reasoning(prompts)
      return self.judge.rewards([p + principle_judge.continued(r)
                                 for p, r in zip(prompts, reasoning)])

