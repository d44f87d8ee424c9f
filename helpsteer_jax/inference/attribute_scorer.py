"""The attribute-scorer interface, and the one loader of configured scorers.

An attribute scorer maps texts in NeMo's regression reward-model format
(`template.regression_text`: the conversation with the response, ending in
the label marker where the attribute model reads its scores) to predictions
[n, 9] in `records.ATTRIBUTES` order. Best-of-n (`best_of_n.scorer`) and
build_2d (`scorer.factory`) take one by name: a registered scorer
(`demo_rules`: the demo data's own rules; `http`: a server's attribute
model, the argument its base URL) or `package.module:function`, a
function called with one argument (best_of_n's `scorer_path`, build_2d's
`config.scorer`) that returns a scorer (how a trained attribute model or
any other judge plugs in).

A `MeshScorer` (the project's attribute model in annotate and build_2d) is
the other kind: it runs on every process and shards each batch over the mesh
itself. A text scorer with `collective = True` (the project's attribute model
in best-of-n) is likewise called by every process with all texts.
`as_mesh_scorer` gives any scorer the `MeshScorer` interface (a host-side
one scores each process's contiguous share of a batch, gathered), and
`predict` scores conversations in batches through it.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from helpsteer_jax import multihost
from helpsteer_jax.data import template
from helpsteer_jax.data.demo import rows as demo_rows
from helpsteer_jax.data.records import ATTRIBUTES, NUM_ATTRIBUTES, Conversation
from helpsteer_jax.errors import ConfigError


class AttributeScorer(Protocol):
  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    """Attribute predictions [len(texts), 9] in `ATTRIBUTES` order."""


def is_collective(scorer: AttributeScorer) -> bool:
  """True for a scorer every process calls with all texts (it shards over the mesh)."""
  return bool(getattr(scorer, "collective", False))


class MeshScorer(Protocol):
  """A scorer that runs on every process and splits its batches over the mesh."""

  local_rows: int  # conversations scored by this process's devices so far

  def score_conversations(self, convs: Sequence[Conversation]) -> np.ndarray:
    """[n, 9] predictions for each conversation's last response (NaN: not scored)."""


def _last_exchange(text: str) -> tuple[str, str]:
  """(last user text, response) of a regression-format text."""
  body = text.removesuffix(template.LABEL_START).removesuffix(template.END_OF_TURN)
  head, _, response = body.rpartition(f"{template.TURN_START}Assistant{template.END_OF_NAME}")
  user = head.rpartition(f"{template.TURN_START}User{template.END_OF_NAME}")[2]
  return user.removesuffix(template.END_OF_TURN), response


class DemoRuleScorer:
  """Scores demo responses by the rules that generated the demo data
  (the four OASST attributes, which the demo data lacks, score 0)."""

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    rows = []
    for text in texts:
      scores = demo_rows.rule_scores(*_last_exchange(text))
      rows.append([scores.get(name, 0) for name in ATTRIBUTES])
    return np.asarray(rows, np.float32).reshape(len(texts), NUM_ATTRIBUTES)


def _http_scorer(url: Any) -> AttributeScorer:
  from helpsteer_jax.inference.remote_scorer import HttpScorer
  return HttpScorer(url)


SCORERS: dict[str, Callable[[Any], AttributeScorer]] = {"demo_rules": lambda arg: DemoRuleScorer(),
                                                        "http": _http_scorer}


def load_scorer(spec: str, arg: Any = None, key: str = "scorer") -> AttributeScorer:
  """A registered scorer name or `package.module:function` called with `arg`.

  `key` is the config key that named the scorer (for error messages).
  """
  if spec in SCORERS:
    return SCORERS[spec](arg)
  module_name, sep, name = spec.partition(":")
  if not sep or not module_name or not name:
    raise ConfigError(f"{key}={spec!r}: use one of {sorted(SCORERS)} or"
                      " 'package.module:function'")
  try:
    factory = getattr(importlib.import_module(module_name), name)
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"{key}={spec!r} cannot be loaded: {e}") from None
  return factory(arg)


def checked_predictions(out: Any, n: int, dtype=np.float32) -> np.ndarray:
  """`out` as [n, 9] `dtype`, or a ConfigError naming the shape the scorer returned."""
  out = np.asarray(out, dtype)
  if out.shape != (n, NUM_ATTRIBUTES):
    raise ConfigError(f"the attribute scorer returned shape {out.shape} for {n} texts;"
                      f" expected ({n}, {NUM_ATTRIBUTES}): one prediction per attribute of"
                      f" {ATTRIBUTES}")
  return out


class SharedScorer:
  """An `AttributeScorer` as a `MeshScorer`: every process is called with the same
  conversations; a host-side scorer scores this process's contiguous share of them
  and the predictions are gathered, a collective one is given them all."""

  def __init__(self, scorer: AttributeScorer):
    self.scorer = scorer
    self.local_rows = 0

  def _score(self, convs: Sequence[Conversation]) -> np.ndarray:
    self.local_rows += len(convs)
    texts = [template.regression_text(c) for c in convs]
    return checked_predictions(self.scorer(texts), len(convs))

  def score_conversations(self, convs: Sequence[Conversation]) -> np.ndarray:
    if is_collective(self.scorer):
      return self._score(convs)
    return multihost.split_map(self._score, convs, NUM_ATTRIBUTES)


def as_mesh_scorer(scorer: AttributeScorer | MeshScorer) -> MeshScorer:
  """`scorer` if it already is a `MeshScorer`, else a `SharedScorer` around it."""
  return scorer if hasattr(scorer, "score_conversations") else SharedScorer(scorer)


def predict(convs: Sequence[Conversation], scorer: MeshScorer, batch_size: int,
            on_batch: Callable[[int], None] | None = None) -> np.ndarray:
  """[n, 9] predictions for the last response of every conversation (NaN: not scored),
  on every process, in scorer calls of `batch_size` conversations."""
  out = [np.zeros((0, NUM_ATTRIBUTES), np.float32)]
  for start in range(0, len(convs), max(batch_size, 1)):
    batch = convs[start:start + max(batch_size, 1)]
    out.append(checked_predictions(scorer.score_conversations(batch), len(batch)))
    if on_batch is not None:
      on_batch(len(batch))
  return np.concatenate(out)
