"""A test double for the attribute model behind the scoring interface (a user's factory).

Scores a conversation from the words of its last response: deterministic,
cheap, and different for every prefix.
"""

import os

import numpy as np

from helpsteer_jax.data.records import ATTRIBUTES

CALLS_DIR_ENV = "HELPSTEER_TEST_SCORER_CALLS"  # make_recording's log directory


def fake_attributes(conv) -> np.ndarray:
  words = conv.turns[-1].text.split()
  out = np.zeros(len(ATTRIBUTES), np.float32)
  out[4] = min(4.0, 0.5 * len(words))                       # helpfulness
  out[5] = 4.0 - 2.0 * sum(w.strip(".,").isdigit() for w in words) % 5   # correctness
  out[6] = 4.0 if all(w.islower() or not w.isalpha() for w in words[1:]) else 1.0  # coherence
  out[7] = sum(len(w) > 7 for w in words) * 0.7              # complexity (clipped by build_2d)
  out[8] = len(words) / 4.0                                  # verbosity
  return out


def make(scorer_config):
  calls = []

  def scorer(convs):
    calls.append(len(convs))
    return np.stack([fake_attributes(c) for c in convs])

  scorer.calls = calls
  return scorer


def make_recording(scorer_config):
  """`make`, appending each call's conversation count to `$HELPSTEER_TEST_SCORER_CALLS/
  calls_<process>.txt`."""
  import pathlib

  import jax
  scorer = make(scorer_config)
  log = pathlib.Path(os.environ[CALLS_DIR_ENV]) / f"calls_{jax.process_index()}.txt"

  def recording(convs):
    with open(log, "a") as f:
      f.write(f"{len(convs)}\n")
    return scorer(convs)

  return recording


def make_brevity(scorer_config):
  """Helpfulness 4 for an empty response, falling with its characters: a reward RL can
  raise quickly from any policy (by ending early)."""
  def scorer(convs):
    out = np.zeros((len(convs), len(ATTRIBUTES)), np.float32)
    for i, conv in enumerate(convs):
      out[i, 4] = 4.0 - min(4.0, len(conv.turns[-1].text) / 16.0)
    return out

  return scorer


def make_binary(scorer_config):
  """Helpfulness 4 for a response of at most 12 characters, else 0: a pass/fail reward,
  as a verifier gives, under which many groups score all alike (dynamic sampling's
  case)."""
  def scorer(convs):
    out = np.zeros((len(convs), len(ATTRIBUTES)), np.float32)
    for i, conv in enumerate(convs):
      out[i, 4] = 4.0 if len(conv.turns[-1].text) <= 12 else 0.0
    return out

  return scorer


def make_numeric(scorer_config):
  """Helpfulness = the number a response starts with ("2.5 because ..."), so a test sets
  each reward by hand; a response starting "unscored" gives a row of NaN (not scored)."""
  def scorer(convs):
    out = np.zeros((len(convs), len(ATTRIBUTES)), np.float32)
    for i, conv in enumerate(convs):
      head = conv.turns[-1].text.split(maxsplit=1)[0]
      if head == "unscored":
        out[i] = np.nan
      else:
        out[i, 4] = float(head)
    return out

  return scorer


def make_unscored(scorer_config):
  """Every conversation unscored (a row of NaN): a judge that judged nothing."""
  def scorer(convs):
    return np.full((len(convs), len(ATTRIBUTES)), np.nan, np.float32)

  return scorer
