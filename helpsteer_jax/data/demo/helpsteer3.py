"""HelpSteer3-shaped demo rows: preference and feedback configs over the same pairs, and
the principle config.

Each row asks one of the demo's questions (arithmetic, a capital, a list) and holds two
one-sentence responses whose helpfulness follows from the text: a right and coherent
answer is "perfectly" helpful (5), a right but garbled one "partially" (3), a wrong
coherent one "slightly" (2), a wrong garbled one "not" (1). Three annotators state the
level (one of them, sometimes, a neighbouring one), and `overall_preference` is the
difference of the two levels clipped to -3..3 (negative: response 1 better; 0: a tie).
About a fifth of the contexts are two user turns (an earlier question answered).

A principle row (`make_principle_row`) holds one response of 1-3 sentences and one of
`PRINCIPLES`, each a property its text shows: one sentence or several, plain or
technical filler sentences, every sentence in order or one garbled (words repeated or
shuffled). Its `fulfilment` is whether the text has the property; the principles differ
in how often it does (`yes_rate`: a fifth of the responses are one sentence, four fifths
plain, four fifths in order). Each principle also names the claim a judge's one-sentence
reasoning makes either way (`runs.principle_demo`'s answer-format examples).

The files are written as the hub ships them: `<config>/{train,validation}.jsonl.gz`.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import pathlib
from typing import Callable, Iterable

import numpy as np

from helpsteer_jax.data.demo import rows

FORMAT_EXAMPLES = "format_sft"  # the demo writers' answer-format rows for an AC-SFT run
LEVELS = ("not", "slightly", "partially", "mostly", "perfectly")
_ITEMS = (rows._math_item, rows._capital_item, rows._list_item)


@dataclasses.dataclass(frozen=True)
class DemoPrinciple:
  """A principle whose verdict the response's text shows, the share of rows that fulfil
  it, and what a judge's reasoning states about a response that fulfils it (`yes_claim`)
  or not (`no_claim`)."""
  text: str
  yes_rate: float
  yes_claim: str
  no_claim: str


PRINCIPLES = (
    DemoPrinciple("The response is a single sentence.", 0.2, "It is one sentence.",
                  "It is more than one sentence."),
    DemoPrinciple("The response uses plain, everyday words.", 0.8, "Its words are plain.",
                  "Its words are technical."),
    DemoPrinciple("The response has no repeated or scrambled words.", 0.8,
                  "Every word is in order.", "Some words are repeated or out of order."),
)


def _response(topic: str, truth, fmt: dict, rng: np.random.RandomState) -> tuple[str, int]:
  correct, garbled = rng.rand() < 0.5, rng.rand() < 0.3
  text = rows._answer(topic, truth, fmt, correct, rng)
  if garbled:
    text = rows._garble(text, rng)
  return text, (5 if correct else 2) - (2 if garbled and correct else 1 if garbled else 0)


def _feedback(level: int, rng: np.random.RandomState) -> list[str]:
  levels = [level] * 3
  if rng.rand() < 0.3:
    levels[2] = int(np.clip(level + rng.choice([-1, 1]), 1, 5))
  return [f"The response is {LEVELS[h - 1]} helpful. It answers: {note}."
          for h, note in zip(levels, ("checked", "read twice", "as asked"))]


def _context(rng: np.random.RandomState) -> tuple[dict, str, object, dict]:
  """A row's shared fields with its `context` (a question, sometimes after an answered
  one), and the question's topic, truth and format fields."""
  question, topic, truth, fmt = _ITEMS[rng.randint(3)](rng)
  context = [{"role": "user", "content": str(question)}]
  if rng.rand() < 0.2:
    first, topic0, truth0, fmt0 = rows._math_item(rng)
    context = [{"role": "user", "content": str(first)},
               {"role": "assistant", "content": rows._answer(topic0, truth0, fmt0, True, rng)},
               *context]
  return {"domain": "general", "language": "english", "context": context}, topic, truth, fmt


def make_rows(rng: np.random.RandomState) -> tuple[dict, dict]:
  """One context's (preference row, feedback row)."""
  shared, topic, truth, fmt = _context(rng)
  (one, h1), (two, h2) = (_response(topic, truth, fmt, rng) for _ in range(2))
  shared = {**shared, "response1": one, "response2": two}
  overall = int(np.clip(h2 - h1, -3, 3))
  preference = {**shared, "overall_preference": overall, "individual_preference": [
      {"score": overall, "reasoning": "@Response 1 and @Response 2 compared."}]}
  feedback = {**shared, "feedback1": _feedback(h1, rng), "feedback2": _feedback(h2, rng)}
  return preference, feedback


def _garbled(sentence: str, rng: np.random.RandomState) -> str:
  """`rows._garble` until the sentence changes (a shuffle can give the same order)."""
  while True:
    out = rows._garble(sentence, rng)
    if out != sentence:
      return out


def make_principle_row(rng: np.random.RandomState) -> dict:
  """One principle-config row: a response of 1-3 sentences (the answer first, then
  fillers in a plain or technical register, perhaps one sentence garbled), one of
  `PRINCIPLES` and whether the text fulfils it."""
  shared, topic, truth, fmt = _context(rng)
  kind = rng.randint(len(PRINCIPLES))  # PRINCIPLES' order: one sentence, plain, in order
  fulfilled = bool(rng.rand() < PRINCIPLES[kind].yes_rate)
  if kind == 0:
    sentences = 1 if fulfilled else 2 + rng.randint(2)
  elif kind == 1:  # the register shows in the fillers: at least one
    sentences = 2 + rng.randint(2)
  else:
    sentences = 1 + rng.randint(3)
  technical = (not fulfilled) if kind == 1 else bool(rng.rand() < 0.4)
  garbled = (not fulfilled) if kind == 2 else bool(rng.rand() < 0.2)
  answer = rows._answer(topic, truth, fmt, bool(rng.rand() < 0.7), rng)
  text = rows._sentences_for(topic, answer, fmt, rows.SENTENCES_PER_VERBOSITY.index(sentences),
                             technical, rng)
  if garbled:
    i = rng.randint(len(text))
    text[i] = _garbled(text[i], rng)
  return {**shared, "response": " ".join(text), "principle": PRINCIPLES[kind].text,
          "fulfilment": "Yes" if fulfilled else "No"}


def write_rows(path: pathlib.Path, records: Iterable[dict]) -> None:
  """`records` as a gzipped JSONL file at `path` (its directory made; written whole, then
  renamed into place)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp")
  with gzip.open(tmp, "wt", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(record) + "\n")
  tmp.replace(path)


def _splits(num_train: int, num_validation: int, seed: int):
  """(split, rows, rng) of the train and validation splits, each with its own seed."""
  for split, n, s in (("train", num_train, seed), ("validation", num_validation, seed + 1)):
    yield split, n, np.random.RandomState([s, 3])


def write_format_examples(out: pathlib.Path,
                          make: Callable[[str, int], list[dict]]) -> None:
  """`out/FORMAT_EXAMPLES/{train,validation}.jsonl.gz`: `make(split, seed)`'s rows."""
  for split, seed in (("train", 1), ("validation", 2)):
    write_rows(out / FORMAT_EXAMPLES / f"{split}.jsonl.gz", make(split, seed))


def write_demo_principle(out_dir: str | pathlib.Path, num_train: int = 2000,
                         num_validation: int = 200, seed: int = 0) -> pathlib.Path:
  """Writes `principle/{train,validation}.jsonl.gz` under `out_dir`."""
  out = pathlib.Path(out_dir)
  for split, n, rng in _splits(num_train, num_validation, seed):
    write_rows(out / "principle" / f"{split}.jsonl.gz",
               [make_principle_row(rng) for _ in range(n)])
  return out


def write_demo_helpsteer3(out_dir: str | pathlib.Path, num_train: int = 2000,
                          num_validation: int = 200, seed: int = 0) -> pathlib.Path:
  """Writes `preference/` and `feedback/` `{train,validation}.jsonl.gz` under `out_dir`."""
  out = pathlib.Path(out_dir)
  for split, n, rng in _splits(num_train, num_validation, seed):
    pairs = [make_rows(rng) for _ in range(n)]
    for config, column in (("preference", 0), ("feedback", 1)):
      write_rows(out / config / f"{split}.jsonl.gz", [pair[column] for pair in pairs])
  return out
