"""The attribute-scorer protocol: conversations -> [n, 9] predictions.

A `Scorer` is called on every process with the same conversations (each
ending in the response to score) and returns the same [n, 9] float32
predictions in `records.ATTRIBUTES` order on every process; a row of NaN
is a conversation it could not score (too long for the attribute model,
say). How the work is shared is the scorer's business:

- the project's attribute model (`model.ModelScorer`) shards each batch over
  the mesh, so each process feeds its own devices' rows;
- `HostScorer` wraps a host-side function (the demo rules, a user's
  factory): each process scores its contiguous share and the rows are
  gathered;
- `PrimaryScorer` wraps a remote one (a server's attribute model): process
  0 alone asks, and every process gets the answer.

A source with one scalar reward (a Bradley-Terry model, a generative judge, a
rule-based verifier) writes it in the `REWARD_SLOT` column and 0 in the others
(`reward_rows`), so that `scorer.weights.helpfulness=1` (the others 0) reads it, as a
Bradley-Terry model's `bt_attribute` slot is read. A pairwise judge compares the
responses of a group: consecutive conversations that answer the same context
(`context_groups`), as RL's K completions of a prompt arrive.

`local_rows` counts the conversations this process scored (a collective
report of the split, `multihost.report_split`). `predict` scores a long list
in calls of `chunk` conversations, with a progress callback.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np

from helpsteer_jax import multihost
from helpsteer_jax.data.records import ATTRIBUTES, NUM_ATTRIBUTES, Conversation
from helpsteer_jax.errors import ConfigError

ScoreFn = Callable[[Sequence[Conversation]], Any]  # conversations -> [n, 9]
REWARD_SLOT = "helpfulness"  # where a one-reward source writes its reward


def reward_rows(reward: Sequence[float] | np.ndarray) -> np.ndarray:
  """[n] scalar rewards as [n, 9] float32 predictions: each in the `REWARD_SLOT` column,
  0 in the others; a NaN reward (not scored) gives a row of NaN."""
  reward = np.asarray(reward, np.float32).reshape(-1)
  out = np.zeros((len(reward), NUM_ATTRIBUTES), np.float32)
  out[:, ATTRIBUTES.index(REWARD_SLOT)] = reward
  out[np.isnan(reward)] = np.nan
  return out


def context_groups(convs: Sequence[Conversation]) -> list[list[int]]:
  """Indices of the runs of consecutive conversations that answer the same context (the
  same system prompt and turns before the last): the groups a pairwise judge compares
  within."""
  groups: list[list[int]] = []
  last = None
  for i, conv in enumerate(convs):
    key = (conv.system, conv.turns[:-1])
    if groups and key == last:
      groups[-1].append(i)
    else:
      groups.append([i])
    last = key
  return groups


class Scorer(Protocol):
  local_rows: int

  def __call__(self, convs: Sequence[Conversation]) -> np.ndarray:
    """[len(convs), 9] float32 predictions for each conversation's last turn (NaN: not
    scored); the same on every process."""


def checked(out: Any, n: int) -> np.ndarray:
  """`out` as [n, 9] float32, or a ConfigError naming the shape a scorer returned."""
  out = np.asarray(out, np.float32)
  if out.shape != (n, NUM_ATTRIBUTES):
    raise ConfigError(f"the attribute scorer returned shape {out.shape} for {n}"
                      f" conversations; expected ({n}, {NUM_ATTRIBUTES}): one prediction per"
                      f" attribute of {ATTRIBUTES}")
  return out


class HostScorer:
  """A host-side function as a `Scorer`: each process scores its contiguous share of the
  conversations, and the predictions are gathered in process order."""

  def __init__(self, fn: ScoreFn):
    self.fn = fn
    self.local_rows = 0

  def _share(self, convs: Sequence[Conversation]) -> np.ndarray:
    self.local_rows += len(convs)
    return checked(self.fn(convs), len(convs))

  def __call__(self, convs: Sequence[Conversation]) -> np.ndarray:
    return multihost.split_map(self._share, list(convs), NUM_ATTRIBUTES)


class PrimaryScorer:
  """A remote scorer as a `Scorer`: process 0 asks it, every process gets the answer (its
  errors too, as ConfigError)."""

  def __init__(self, fn: ScoreFn):
    self.fn = fn
    self.local_rows = 0

  def _ask(self, convs: Sequence[Conversation]) -> list:
    self.local_rows += len(convs)
    return checked(self.fn(convs), len(convs)).tolist()

  def __call__(self, convs: Sequence[Conversation]) -> np.ndarray:
    rows = multihost.on_primary(lambda: self._ask(convs))
    return np.asarray(rows, np.float32).reshape(len(convs), NUM_ATTRIBUTES)


def predict(convs: Sequence[Conversation], scorer: Scorer,
            on_batch: Callable[[int], None] | None = None, chunk: int = 512) -> np.ndarray:
  """[n, 9] predictions for every conversation (NaN: not scored), on every process, in
  scorer calls of `chunk` conversations; `on_batch(k)` after each call."""
  out = [np.zeros((0, NUM_ATTRIBUTES), np.float32)]
  chunk = max(int(chunk), 1)
  for start in range(0, len(convs), chunk):
    batch = convs[start:start + chunk]
    out.append(checked(scorer(batch), len(batch)))
    if on_batch is not None:
      on_batch(len(batch))
  return np.concatenate(out)


def predict_groups(groups: Sequence[Sequence[Conversation]], scorer: Scorer,
                   on_batch: Callable[[int], None] | None = None,
                   chunk: int = 512) -> list[np.ndarray]:
  """Each group's [len(group), 9] predictions (NaN: not scored), on every process.

  Each group holds the responses to one context. A scorer call holds whole groups (up to
  `chunk` conversations, or one larger group), and no two adjacent groups of a call
  answer the same context, so every group is one of the call's `context_groups`: what a
  pairwise judge compares within. `on_batch(k)` after each call.
  """
  calls: list[list[int]] = []
  size, last = 0, None
  for i, group in enumerate(groups):
    key = (group[0].system, group[0].turns[:-1])
    if calls and (key == last or size + len(group) > chunk):
      calls.append([])
      size = 0
    if not calls:
      calls.append([])
    calls[-1].append(i)
    size += len(group)
    last = key
  out: list[np.ndarray] = [np.zeros((0, NUM_ATTRIBUTES), np.float32)] * len(groups)
  for call in calls:
    convs = [c for i in call for c in groups[i]]
    preds = checked(scorer(convs), len(convs))
    start = 0
    for i in call:
      out[i] = preds[start:start + len(groups[i])]
      start += len(groups[i])
    if on_batch is not None:
      on_batch(len(convs))
  return out
