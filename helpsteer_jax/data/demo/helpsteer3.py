"""HelpSteer3-shaped demo rows: preference and feedback configs over the same pairs.

Each row asks one of the demo's questions (arithmetic, a capital, a list) and holds two
one-sentence responses whose helpfulness follows from the text: a right and coherent
answer is "perfectly" helpful (5), a right but garbled one "partially" (3), a wrong
coherent one "slightly" (2), a wrong garbled one "not" (1). Three annotators state the
level (one of them, sometimes, a neighbouring one), and `overall_preference` is the
difference of the two levels clipped to -3..3 (negative: response 1 better; 0: a tie).
About a fifth of the contexts are two user turns (an earlier question answered). The
files are written as the hub ships them: `<config>/{train,validation}.jsonl.gz`.
"""

from __future__ import annotations

import gzip
import json
import pathlib

import numpy as np

from helpsteer_jax.data.demo import rows

LEVELS = ("not", "slightly", "partially", "mostly", "perfectly")
_ITEMS = (rows._math_item, rows._capital_item, rows._list_item)


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


def make_rows(rng: np.random.RandomState) -> tuple[dict, dict]:
  """One context's (preference row, feedback row)."""
  maker = _ITEMS[rng.randint(3)]
  question, topic, truth, fmt = maker(rng)
  context = [{"role": "user", "content": str(question)}]
  if rng.rand() < 0.2:
    first, topic0, truth0, fmt0 = rows._math_item(rng)
    context = [{"role": "user", "content": str(first)},
               {"role": "assistant", "content": rows._answer(topic0, truth0, fmt0, True, rng)},
               *context]
  (one, h1), (two, h2) = (_response(topic, truth, fmt, rng) for _ in range(2))
  shared = {"domain": "general", "language": "english", "context": context,
            "response1": one, "response2": two}
  overall = int(np.clip(h2 - h1, -3, 3))
  preference = {**shared, "overall_preference": overall, "individual_preference": [
      {"score": overall, "reasoning": "@Response 1 and @Response 2 compared."}]}
  feedback = {**shared, "feedback1": _feedback(h1, rng), "feedback2": _feedback(h2, rng)}
  return preference, feedback


def write_demo_helpsteer3(out_dir: str | pathlib.Path, num_train: int = 2000,
                          num_validation: int = 200, seed: int = 0) -> pathlib.Path:
  """Writes `preference/` and `feedback/` `{train,validation}.jsonl.gz` under `out_dir`."""
  out = pathlib.Path(out_dir)
  for split, n, s in (("train", num_train, seed), ("validation", num_validation, seed + 1)):
    rng = np.random.RandomState([s, 3])
    pairs = [make_rows(rng) for _ in range(n)]
    for config, column in (("preference", 0), ("feedback", 1)):
      path = out / config / f"{split}.jsonl.gz"
      path.parent.mkdir(parents=True, exist_ok=True)
      tmp = path.with_suffix(".tmp")
      with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for pair in pairs:
          f.write(json.dumps(pair[column]) + "\n")
      tmp.replace(path)
  return out
