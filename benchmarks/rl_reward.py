"""The reward of benchmarks/rl_iteration.py, shared by both sides (no jax or torch here).

`reward(text)`: a cheap deterministic function of a completion's text (a
brevity reward, 4 for an empty answer). TRL calls `trl_reward`; our RL task
calls the scorer factory `make_scorer` (`scorer.source="rl_reward:make_scorer"`),
whose predictions put the reward in the helpfulness column, weighted 1.
"""

HELPFULNESS = 4    # the column of `helpsteer_jax.data.records.ATTRIBUTES`
NUM_ATTRIBUTES = 9


def reward(text: str) -> float:
  return 4.0 - min(4.0, len(text) / 16.0)


def trl_reward(completions, **kwargs) -> list[float]:
  """A TRL reward function: completions are the decoded texts (standard format)."""
  return [reward(c) for c in completions]


def make_scorer(scorer_config):
  """Our scorer factory: conversations -> [n, 9] predictions."""
  import numpy as np

  def scorer(convs):
    out = np.zeros((len(convs), NUM_ATTRIBUTES), np.float32)
    for i, conv in enumerate(convs):
      out[i, HELPFULNESS] = reward(conv.turns[-1].text)
    return out

  return scorer
