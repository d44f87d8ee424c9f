"""The demo data's own rules as a scorer (a stand-in attribute model for demos and tests)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from helpsteer_jax import choices
from helpsteer_jax.data.demo import rows as demo_rows
from helpsteer_jax.data.records import ATTRIBUTES, NUM_ATTRIBUTES, Conversation

DEMO_RULES = choices.DEMO_RULES  # its name as a scorer source


def _last_exchange(conv: Conversation) -> tuple[str, str]:
  """(the user turn before the response, the response)."""
  *context, response = conv.turns
  user = next((t.text for t in reversed(context) if t.role == "User"), "")
  return user, response.text


def demo_rule_scores(convs: Sequence[Conversation]) -> np.ndarray:
  """[n, 9]: the scores the demo generator's rules give each response (the four OASST
  attributes, which the demo data lacks, score 0)."""
  rows = []
  for conv in convs:
    scores = demo_rows.rule_scores(*_last_exchange(conv))
    rows.append([scores.get(name, 0) for name in ATTRIBUTES])
  return np.asarray(rows, np.float32).reshape(len(convs), NUM_ATTRIBUTES)
