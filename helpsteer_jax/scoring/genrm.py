"""A GenRM as a reward source: the rule-based verifier that trains one, and a trained
one judging a group's completions.

- `VERIFIER` (`scorer.source=genrm_verifier`): each conversation's last turn is a
  judge's answer, checked against the prompt row's `reference` (`Conversation.reference`)
  by `judges.genrm.verifier_reward`; a `scorer.HostScorer` function.
- `GenrmJudge` (`scorer.judge=genrm`): within each group of consecutive conversations
  answering the same context (`scorer.context_groups`, RL's K completions), every
  ordered pair (i, j), i != j, is judged with i shown as response 1 (both orders: the
  judge's position bias cancels); a group of one is judged against itself. The
  judgements become per-completion rewards by `scorer.aggregation`
  (`judges.genrm.aggregate`: the mean individual score, or the share of wins); a
  judgement that does not parse is skipped, a completion none counted for is NaN (not
  scored), or, with `unparsed` set (RL: `genrm.NEUTRAL`), gets that reward when its pairs
  were answered and no answer parsed. The answers come from `answer(prompts) -> texts`
  (None: a prompt the judge's budget leaves no room to answer): a causal LM decoding
  greedily on the engine (`inference.judge`, every process the same; its
  `judge_budget.Budget`) or a server's /v1/chat/completions (`ServedAnswers`, asked by
  process 0: `scorer.PrimaryScorer`). `counts` says how its judgements went: answered,
  not asked (over the budget), not parsed.

Both write their reward in the `REWARD_SLOT` column (`scorer.reward_rows`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from helpsteer_jax import choices
from helpsteer_jax.data.records import Conversation
from helpsteer_jax.data.template import DEFAULT_SYSTEM
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.judges import genrm
from helpsteer_jax.judges.client import JudgeError, OpenAIJudge, served_models
from helpsteer_jax.scoring import remote
from helpsteer_jax.scoring.judge_budget import Budget
from helpsteer_jax.scoring.scorer import context_groups, reward_rows

VERIFIER = choices.GENRM_VERIFIER  # its name as a scorer source
# judge prompts -> answers (None: not asked, the prompt over the judge's budget)
Answer = Callable[[Sequence[str]], Sequence[str | None]]


def verifier_rows(convs: Sequence[Conversation]) -> np.ndarray:
  """[n, 9]: the verifier reward of each conversation's last turn against its reference."""
  rewards = []
  for conv in convs:
    if conv.reference is None:
      raise ConfigError(f"{VERIFIER} scores a judge's answer against its prompt's"
                        " `reference`, and a conversation has none: give prompts with"
                        " references (prompts.format=genrm, or JSONL rows {\"prompt\","
                        " \"reference\"})")
    rewards.append(genrm.verifier_reward(conv.turns[-1].text, conv.reference))
  return reward_rows(rewards)


def judged_pairs(convs: Sequence[Conversation]) -> list[tuple[int, int]]:
  """The ordered pairs a group's judge compares: (i, j), i != j, within each
  `context_groups` group; (i, i) for a group of one."""
  pairs = []
  for group in context_groups(convs):
    pairs += [(i, j) for i in group for j in group if i != j] or [(group[0], group[0])]
  return pairs


def context_of(conv: Conversation) -> Conversation:
  """The conversation before its last (assistant) turn: what both responses answer."""
  return Conversation(system=conv.system, turns=conv.turns[:-1])


class GenrmJudge:
  """Conversations -> [n, 9] rewards from a GenRM's judgements of each group's pairs;
  `budget` is a local judge's (`answer` then has `tokens(prompt)`), None for a served
  one."""

  def __init__(self, answer: Answer, aggregation: str = "mean_score",
               guidelines: bool = True, budget: Budget | None = None,
               unparsed: float | None = None):
    if aggregation not in genrm.AGGREGATIONS:
      raise ConfigError(f"scorer.aggregation={aggregation!r}: expected one of"
                        f" {', '.join(genrm.AGGREGATIONS)}")
    self.answer = answer
    self.aggregation = aggregation
    self.guidelines = guidelines
    self.budget, self.unparsed = budget, unparsed
    self.local_rows = 0
    self.counts = {"answered": 0, "not_asked": 0, "not_parsed": 0}

  def prompts(self, convs: Sequence[Conversation]) -> tuple[list[tuple[int, int]], list[str]]:
    """The ordered pairs the judge compares and their judge prompts."""
    pairs = judged_pairs(convs)
    return pairs, [genrm.prompt(context_of(convs[i]), (convs[i].turns[-1].text,
                                                       convs[j].turns[-1].text),
                                self.guidelines) for i, j in pairs]

  def prompt_tokens(self, group: Sequence[Conversation]) -> np.ndarray:
    """[len(group)] each conversation's shortest judge prompt in tokens (its pairs')."""
    pairs, prompts = self.prompts(list(group))
    out = np.full(len(group), np.iinfo(np.int64).max, np.int64)
    for (i, j), text in zip(pairs, prompts):
      n = self.answer.tokens(text)
      out[i], out[j] = min(out[i], n), min(out[j], n)
    return out

  def __call__(self, convs: Sequence[Conversation]) -> np.ndarray:
    convs = list(convs)
    self.local_rows += len(convs)
    pairs, prompts = self.prompts(convs)
    answers = list(self.answer(prompts)) if prompts else []
    judgements = [None if text is None else genrm.parse(text) for text in answers]
    asked = [text is not None for text in answers]
    self.counts["answered"] += sum(asked)
    self.counts["not_asked"] += asked.count(False)
    self.counts["not_parsed"] += sum(a and j is None for a, j in zip(asked, judgements))
    reward = genrm.aggregate(len(convs), pairs, judgements, self.aggregation)
    if self.unparsed is not None:  # answered, nothing parsed: the stand-in reward
      answered = np.zeros(len(convs), bool)
      for (i, j), a in zip(pairs, asked):
        answered[[i, j]] |= a
      reward[np.isnan(reward) & answered] = self.unparsed
    return reward_rows(reward)


class ServedAnswers:
  """Judge prompts answered by an OpenAI-compatible server's chat completions
  (`judges.client.OpenAIJudge`: temperature 0, the openai client's retries), each prompt
  one user message after the chat's default system prompt; `model` "" = the one the
  server lists first (asked at the first call). `$HELPSTEER_API_KEY` is the key."""

  def __init__(self, url: str, max_tokens: int, model: str = ""):
    if not remote.is_url(url):
      raise ConfigError(f"a served judge needs the server's base URL, got {url!r}")
    self.url, self.max_tokens = url, int(max_tokens)
    self.judge = self._judge(model) if model else None

  def _judge(self, model: str) -> OpenAIJudge:
    return OpenAIJudge(self.url, model, api_key_env=remote.API_KEY_ENV,
                       max_tokens=self.max_tokens)

  def __call__(self, prompts: Sequence[str]) -> list[str]:
    if self.judge is None:
      served = served_models(self.url, remote.API_KEY_ENV)
      if not served:
        raise ConfigError(f"{self.url} lists no model to judge with: set scorer.judge_model")
      self.judge = self._judge(served[0])
    try:
      return [self.judge(DEFAULT_SYSTEM, text) for text in prompts]
    except JudgeError as e:
      raise ConfigError(f"the judge at {self.url}: {e}") from None
