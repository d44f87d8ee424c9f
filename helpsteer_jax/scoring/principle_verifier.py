"""`principle_verifier`: the training reward of a principle judge (RLBFF) that RL trains,
as a reward source (`judges.principle.training_reward`).

The policy is the judge: each rollout answers a judge prompt whose reference holds the
human truth (HelpSteer3's principle rows, `runs.prompts`), and its reward is its own raw
log p(" Yes") - log p(" No") at the verdict token of that very rollout, signed by the
truth, `scorer.penalty` when either token is missing from the top 20 alternatives there
or the answer has no judgement. The engine already reports the top 20 raw log-probs of
every generated token (`Output.raw`) and the sampling path adds the output to the
answered conversation's reference (`records.ANSWER_KEY`), so the reward is a host-side
function of the conversations on the one scorer seam: the same numbers NeMo-RL gets from
an extra forward pass over each rollout, without that pass and without a second loop.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from helpsteer_jax import choices
from helpsteer_jax.data.records import ANSWER_KEY, Conversation
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.judges import principle
from helpsteer_jax.scoring.scorer import reward_rows

VERIFIER = choices.PRINCIPLE_VERIFIER  # its name as a scorer source


class PrincipleVerifier:
  """Conversations answered by the judge being trained -> [n, 9] reward rows."""

  def __init__(self, tokenizer: Any, penalty: float = principle.PENALTY):
    self.tokenizer, self.penalty = tokenizer, float(penalty)
    self.tokens = principle.verdict_tokens(
        lambda s: tokenizer(s, add_special_tokens=False)["input_ids"])

  def _decode(self, ids: Sequence[int]) -> str:
    return self.tokenizer.decode(list(ids), skip_special_tokens=False)

  def verdicts(self, conv: Conversation) -> tuple[float, float]:
    """(log p(yes), log p(no)) at the verdict token of the answer (-inf: not in the top
    20; NaN: no judgement)."""
    output = (conv.reference or {}).get(ANSWER_KEY)
    if output is None:
      raise ConfigError(
          f"scorer.source={VERIFIER}: conversation {conv.source or ''} carries no rollout"
          " output; the principle judge's training reward reads the policy's own"
          " log-probabilities of its verdict, which only on-policy single-turn rollouts"
          " of prompts with a reference carry (rollout.max_staleness=0,"
          " rollout.multi_turn=false, prompts.format=principle)")
    ids = list(output.token_ids)
    pos = principle.judgement_position(ids, self._decode, self.tokens)
    if pos is None:
      return math.nan, math.nan
    return principle.verdict_logprobs(output.raw.top_ids[pos], output.raw.top[pos],
                                      self.tokens)

  def __call__(self, convs: Sequence[Conversation]) -> np.ndarray:
    yes, no = zip(*(self.verdicts(c) for c in convs)) if convs else ((), ())
    try:
      truths = [principle.truth(c.reference, c.source) for c in convs]
    except ValueError as e:
      raise ConfigError(f"scorer.source={VERIFIER}: {e}") from None
    return reward_rows(principle.training_reward(yes, no, truths, self.penalty))
