"""A test double for the attribute model behind build_2d's scoring interface.

Scores a NeMo regression-format text from the words of its last response:
deterministic, cheap, and different for every prefix.
"""

import numpy as np

from helpsteer_jax.data.records import ATTRIBUTES


def last_response(text: str) -> str:
  return text.rsplit("<extra_id_1>Assistant\n", 1)[1].rsplit("\n<extra_id_2>", 1)[0]


def fake_attributes(text: str) -> np.ndarray:
  words = last_response(text).split()
  out = np.zeros(len(ATTRIBUTES), np.float32)
  out[4] = min(4.0, 0.5 * len(words))                       # helpfulness
  out[5] = 4.0 - 2.0 * sum(w.strip(".,").isdigit() for w in words) % 5   # correctness
  out[6] = 4.0 if all(w.islower() or not w.isalpha() for w in words[1:]) else 1.0  # coherence
  out[7] = sum(len(w) > 7 for w in words) * 0.7              # complexity (clipped by build_2d)
  out[8] = len(words) / 4.0                                  # verbosity
  return out


def make(scorer_config):
  calls = []

  def scorer(texts):
    calls.append(len(texts))
    return np.stack([fake_attributes(t) for t in texts])

  scorer.calls = calls
  return scorer


def make_recording(scorer_config):
  """`make`, appending each call's text count to `<scorer.checkpoint>/calls_<process>.txt`."""
  import pathlib

  import jax
  scorer = make(scorer_config)
  log = pathlib.Path(scorer_config.checkpoint) / f"calls_{jax.process_index()}.txt"

  def recording(texts):
    with open(log, "a") as f:
      f.write(f"{len(texts)}\n")
    return scorer(texts)

  return recording
