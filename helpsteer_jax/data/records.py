"""In-memory records: one conversation with its SteerLM attribute labels."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

# NeMo-Aligner's ALL_STEERLM_ATTRIBUTES: OpenAssistant's four, then HelpSteer's five.
ATTRIBUTES = ("quality", "toxicity", "humor", "creativity", "helpfulness",
              "correctness", "coherence", "complexity", "verbosity")
HELPSTEER_ATTRIBUTES = ATTRIBUTES[4:]
# The attributes a SteerLM prompt requests that a reward can hold it to
STEERABLE = ("complexity", "verbosity")
# HelpSteer-2D's five aspects, scored per segment
ASPECTS_2D = ("helpfulness", "correctness", "safety", "completeness", "clarity")
NUM_ATTRIBUTES = len(ATTRIBUTES)
ROLES = ("User", "Assistant")
MIN_SCORE, MAX_SCORE = 0, 4
IGNORE_LABEL = -100.0  # a missing attribute (NeMo-Aligner's convention)
CHOSEN, REJECTED = 1, 2  # a BT pair row's `pair` marks at each response's last token
# The reference key under which the sampling path adds the engine's output that answered
# the conversation (its token ids and the policy's raw top log-probs at each token)
ANSWER_KEY = "answer"


@dataclasses.dataclass(frozen=True)
class Turn:
  """One turn; `label` is the attribute string of an assistant turn (or None).

  `trainable=False` keeps an assistant turn as context only (no loss), as for
  the earlier turns inside a HelpSteer2 prompt.
  """
  role: str
  text: str
  label: str | None = None
  trainable: bool = True


@dataclasses.dataclass(frozen=True)
class Conversation:
  """A system prompt and its turns, as NeMo's SteerLM chat format holds them.

  `mask_role` is NeMo's "mask": the role whose turns carry no loss.
  `attributes` are the scores of the last assistant turn (HelpSteer rows, and
  SteerLM rows whose last turn is a labelled assistant turn), else None.
  `source` is "path:line" for messages. `reference` is what a rule-based reward
  checks the last answer against (a judge prompt's human labels: a GenRM's scores
  and ranking, a principle's truth), else None; it is the prompt row's `reference`
  field and travels to the scorer with the answered conversation; when the engine
  answered it, the reference also holds that output under `ANSWER_KEY` (a judge's
  training reward reads the policy's own log-probabilities of its verdict there).
  """
  system: str
  turns: tuple[Turn, ...]
  mask_role: str = "User"
  attributes: Mapping[str, int] | None = None
  source: str = ""
  reference: Mapping[str, Any] | None = None

  def answered(self, response: str) -> Conversation:
    """This conversation with `response` as its last (assistant, unlabelled) turn: what
    the attribute model scores."""
    return dataclasses.replace(self, turns=self.turns + (Turn("Assistant", response),))
