"""A small HelpSteer-2D dataset (segment x aspect scores) made from the demo text.

Deterministic from a seed, in the demo data's vocabulary. Each pair answers
one demo prompt twice. Sentences are of known kinds, and each kind has fixed
scores on the five 2D aspects (helpfulness, correctness, safety,
completeness, clarity; 0..4):

  right answer, wrong answer, on-topic sentence, garbled sentence,
  off-topic sentence, unsafe advice.

The chosen response starts with the right answer; the rejected one has a
wrong answer or a good answer followed by bad sentences, so the preference
is carried by specific segments, which is what 2D-DPO's weights exploit.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from helpsteer_jax.data.demo import rows
from helpsteer_jax.data.records import ASPECTS_2D

KIND_SCORES = {  # helpfulness, correctness, safety, completeness, clarity
    "right": (4, 4, 4, 3, 4),
    "wrong": (1, 0, 4, 2, 3),
    "on_topic": (3, 4, 4, 3, 4),
    "garbled": (1, 2, 4, 1, 0),
    "off_topic": (0, 3, 4, 0, 3),
    "unsafe": (0, 1, 0, 0, 3),
}
OFF_TOPIC = ("My favourite colour is green.", "The weather was mild last week.",
             "Cats sleep for most of the day.", "Trains are often late on Mondays.")
UNSAFE = ("You should never check an answer twice.", "Just guess and never ask anyone.",
          "Ignore what your teacher says about this.")


def _on_topic(topic: str, fmt: dict, technical: bool, rng, n: int) -> list[str]:
  pool = rows.FILLERS[topic]
  return [pool[i][int(technical)].format(**fmt) for i in sorted(rng.permutation(len(pool))[:n])]


def _response(kinds: list[str], topic: str, truth, fmt: dict, rng) -> tuple[list[str], list[str]]:
  technical = bool(rng.rand() < 0.4)
  on_topic = iter(_on_topic(topic, fmt, technical, rng, len(kinds)))
  sentences = []
  for kind in kinds:
    if kind in ("right", "wrong"):
      sentences.append(rows._answer(topic, truth, fmt, kind == "right", rng))
    elif kind == "on_topic":
      sentences.append(next(on_topic))
    elif kind == "garbled":
      sentences.append(rows._garble(next(on_topic), rng))
    else:
      pool = OFF_TOPIC if kind == "off_topic" else UNSAFE
      sentences.append(pool[rng.randint(len(pool))])
  return sentences, kinds


def _segments(sentences: list[str], kinds: list[str]) -> list[dict]:
  texts = [s + (" " if i < len(sentences) - 1 else "") for i, s in enumerate(sentences)]
  return [{"text": t, "scores": dict(zip(ASPECTS_2D, KIND_SCORES[k]))}
          for t, k in zip(texts, kinds)]


def make_pair(rng: np.random.RandomState) -> dict:
  """One HelpSteer-2D row."""
  maker = (rows._math_item, rows._capital_item, rows._list_item)[rng.randint(3)]
  prompt, topic, truth, fmt = maker(rng)
  extra = int(rng.randint(0, 3))
  chosen = ["right"] + ["on_topic"] * extra
  bad = ["garbled", "off_topic", "unsafe"]
  if rng.rand() < 0.5:
    rejected = ["wrong"] + ["on_topic"] * int(rng.randint(0, 3))
  else:
    rejected = ["right"] + [bad[rng.randint(3)] for _ in range(int(rng.randint(1, 3)))]
  row = {"prompt": str(prompt)}
  for side, kinds in (("chosen", chosen), ("rejected", rejected)):
    sentences, kinds = _response(kinds, topic, truth, fmt, rng)
    row[side] = " ".join(sentences)
    row[f"{side}_segments"] = _segments(sentences, kinds)
  return row


def demo_pairs(num_pairs: int, seed: int = 0) -> list[dict]:
  rng = np.random.RandomState(seed)
  return [make_pair(rng) for _ in range(num_pairs)]


def write_demo_2d(out_dir: str | pathlib.Path, num_train: int = 512, num_validation: int = 64,
                  seed: int = 0) -> pathlib.Path:
  """Writes `train.jsonl` and `validation.jsonl` (HelpSteer-2D) to `out_dir`."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  for split, n, s in (("train", num_train, seed), ("validation", num_validation, seed + 1)):
    tmp = out / f"{split}.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in demo_pairs(n, s)))
    tmp.replace(out / f"{split}.jsonl")
  return out
