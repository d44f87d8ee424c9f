"""RLBFF's principle judge (NVIDIA, "RLBFF: Binary Flexible Feedback", arXiv 2509.21319):
its prompt, its `Final Judgement: Yes` / `No` and its rewards (text and NumPy only).

The judge reads a conversation (earlier turns as a transcript), the response to its last
user turn and a principle, reasons, and ends with `Final Judgement: Yes` or `No`.
RLBFF's released judge takes the principle as a role of its own chat template; that
template is not reproduced here, so the prompt is the project's wording of the same
three inputs and the same closing line.

Rewards (NeMo-RL's principle GenRM environments, branch
`jiaqiz/nemo-posttraining-principle-rm`):

- training the judge (`PrincipleGenrmVerifyWorker.calculate_rewards`): log p(" Yes") -
  log p(" No") at the judgement token, signed by the truth (+ when the human label is
  Yes, - when No), both read from the top `k` alternatives the sampler reports there
  (vLLM's 20); `PENALTY` when either token is missing from them or the answer has no
  judgement;
- the judge as a policy's reward (`PrincipleGenrmForRLHFEnvironment`): the unsigned
  difference at the judgement token.

" Yes" and " No" are single tokens in the judges' tokenizers (NeMo-RL requires it). A
tokenizer that splits them (a small byte-level BPE: " " "Y" "es") is read at the first
token where their encodings differ, after their shared prefix (`verdict_tokens`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from helpsteer_jax.data.records import Conversation

JUDGEMENT = "Final Judgement:"
YES, NO = " Yes", " No"  # the verdicts as the judge writes them after JUDGEMENT
PENALTY = -50.0  # NeMo-RL's training reward for a missing token or judgement
TRUTH_KEY = "fulfilment"  # the reference's truth, as HelpSteer3's principle field
PRINCIPLE_KEY = "principle"  # the reference's principle
_VERDICT = re.compile(re.escape(JUDGEMENT) + r"[ \t]*(Yes|No)\b")


def transcript(conv: Conversation) -> str:
  """The conversation's turns as "Role: text" paragraphs (its system prompt first, as
  "System: ...", when it has one)."""
  parts = [f"System: {conv.system}"] if conv.system else []
  parts += [f"{t.role}: {t.text}" for t in conv.turns]
  return "\n\n".join(parts)


def judge_prompt(context: Conversation, response: str, principle: str) -> str:
  """The judge's request: `context` (the turns before the response, ending with a user
  turn), the assistant's `response` to it and the `principle`; the answer is to end with
  `Final Judgement: Yes` or `No`."""
  return (
      "You are judging whether the assistant's response to the conversation below"
      " fulfils a principle.\n\n"
      f"[Conversation]\n{transcript(context)}\n\n"
      f"[Response]\n{response}\n\n"
      f"[Principle]\n{principle}\n\n"
      "Think about whether the response fulfils the principle, then end your answer with"
      f' "{JUDGEMENT} Yes" if it does or "{JUDGEMENT} No" if it does not.')


def answer(fulfilled: bool, reasoning: str = "") -> str:
  """An answer in the prompt's format (the reasoning, if given, then the judgement): what
  a judge writes, for demos and tests."""
  verdict = f"{JUDGEMENT}{YES if fulfilled else NO}"
  return f"{reasoning}\n{verdict}" if reasoning else verdict


def parse_judgement(text: str) -> bool | None:
  """The answer's last `Final Judgement: Yes` (True) or `No` (False); None without one."""
  found = list(_VERDICT.finditer(text))
  return None if not found else found[-1].group(1) == "Yes"


def judgement_offset(text: str) -> int | None:
  """The character offset right after the last parsed `Final Judgement:` (where the
  verdict token starts), None without a judgement."""
  found = list(_VERDICT.finditer(text))
  return None if not found else found[-1].start() + len(JUDGEMENT)


@dataclasses.dataclass(frozen=True)
class VerdictTokens:
  """How a tokenizer writes the verdicts: their shared leading ids (`prefix`, often
  none) and the first ids where " Yes" and " No" differ (`yes`, `no`)."""
  prefix: tuple[int, ...]
  yes: int
  no: int

  @property
  def prefix_len(self) -> int:
    return len(self.prefix)


def verdict_tokens(encode: Callable[[str], Sequence[int]]) -> VerdictTokens:
  """`VerdictTokens` from `encode` (text -> ids without special tokens)."""
  yes, no = list(encode(YES)), list(encode(NO))
  n = 0
  while n < min(len(yes), len(no)) and yes[n] == no[n]:
    n += 1
  if n == len(yes) or n == len(no):
    raise ValueError(f"the tokenizer writes {YES!r} as {yes} and {NO!r} as {no}: no token"
                     " tells them apart")
  return VerdictTokens(tuple(int(i) for i in yes[:n]), int(yes[n]), int(no[n]))


def judgement_position(ids: Sequence[int], decode: Callable[[Sequence[int]], str],
                       tokens: VerdictTokens, text: str | None = None) -> int | None:
  """The index in `ids` (an answer's tokens) of the verdict token: the one that writes
  the first character after the last `Final Judgement:` and its verdict's shared prefix
  (" Yes" / " No" themselves in a judge's tokenizer). None when the answer (`text`,
  default `decode(ids)`) has no judgement. A binary search over the decoded prefixes'
  lengths: O(log T) decodes."""
  text = decode(ids) if text is None else text
  offset = judgement_offset(text)
  if offset is None:
    return None
  offset += len(decode(list(tokens.prefix))) if tokens.prefix else 0
  lo, hi = 1, len(ids)  # the shortest prefix whose text reaches past `offset`
  while lo < hi:
    mid = (lo + hi) // 2
    if len(decode(ids[:mid])) > offset:
      hi = mid
    else:
      lo = mid + 1
  return lo - 1 if len(decode(ids[:lo])) > offset else None


def verdict_logprobs(top_ids: np.ndarray, top: np.ndarray, tokens: VerdictTokens
                     ) -> tuple[float, float]:
  """(log p(yes), log p(no)) of one position's top alternatives (`top_ids`, `top` [k]);
  -inf for a token not among them."""
  top_ids, top = np.asarray(top_ids).reshape(-1), np.asarray(top, np.float64).reshape(-1)

  def find(token: int) -> float:
    hit = top[top_ids == token]
    return float(hit.max()) if hit.size else float("-inf")

  return find(tokens.yes), find(tokens.no)


def training_reward(yes: Iterable[float], no: Iterable[float], fulfilled: Iterable[bool],
                    penalty: float = PENALTY) -> np.ndarray:
  """[n] float64: log p(yes) - log p(no) when the truth is Yes, the opposite when No;
  `penalty` where either is -inf (not in the top k) or NaN (no judgement)."""
  yes, no = np.asarray(list(yes), np.float64), np.asarray(list(no), np.float64)
  fulfilled = np.asarray(list(fulfilled), bool)
  valid = np.isfinite(yes) & np.isfinite(no)
  with np.errstate(invalid="ignore"):
    signed = np.where(fulfilled, yes - no, no - yes)
  return np.where(valid, signed, float(penalty))


def truth(reference: Mapping[str, Any] | None, where: str = "") -> bool:
  """A reference's `fulfilment` ("Yes" / "No") as a bool; ValueError naming `where`
  otherwise."""
  value = (reference or {}).get(TRUTH_KEY)
  if value not in ("Yes", "No"):
    raise ValueError(f"{where or 'a conversation'}: its reference has no {TRUTH_KEY}"
                     f" 'Yes' or 'No' (got {value!r}); the principle judge's training"
                     " reward compares the judgement with it")
  return value == "Yes"


def prompt_row(record: Any) -> dict:
  """A HelpSteer3 `Principle` record as an RL prompt row: the judge's prompt and the
  truth as its reference (with the principle and the row's file and line)."""
  ctx = record.context
  return {"prompt": judge_prompt(ctx.conversation, record.response, record.principle),
          "domain": ctx.domain, "language": ctx.language,
          "reference": {TRUTH_KEY: "Yes" if record.fulfilled else "No",
                        PRINCIPLE_KEY: record.principle, "source": record.source}}
