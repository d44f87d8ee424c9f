"""A pairwise generative reward model (GenRM) on HelpSteer3: its prompt, the parser of its
answer and the verifier reward that trains it by RL.

The prompt follows the HelpSteer3 GenRM template of NeMo-RL's GenRM recipe (the
helpfulness guidelines 1-5, the ranking 1-6 with no tie, the answer's sections); a
multi-turn context is a transcript ("User: ...", "Assistant: ...") inside it. The
answer ends with

  [The Begin of Individual Scores]
  \\boxed{s1, s2}
  [The End of Individual Scores]
  [The Begin of Ranking Score]
  \\boxed{z}
  [The End of Ranking Score]

`verifier_reward` is NeMo-Aligner's GenRM verifier, r = -(|s1-h1| + |s2-h2| + |z-rank|),
the score terms only where both labels exist, and `PARSE_FAILURE` (-100) when the
answer does not parse. Parsing (`parse`) takes, as the reference does, the text after
the last section opener up to its closer (the whole answer when the opener is missing)
and in it the last balanced `\\boxed{...}`. Where the reference adds 100 for one
unreadable term and still counts the others, or reads numbers outside the scales, this
parser calls the answer a failure: a score box that is not exactly two integers in 1-5,
a ranking box that is not one integer in 1-6, a missing box.

Labels (the project's choice, docs/tasks/genrm.md): h is HelpSteer3 feedback's mean
helpfulness over annotators rounded half up (`helpfulness_label`), rank is
`overall_preference` -3..-1 -> 1..3 and 1..3 -> 4..6, a tie has none (`ranking_label`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping, Sequence

import numpy as np

from helpsteer_jax.data.records import Conversation

SCORE_RANGE = (1, 5)     # individual helpfulness
RANKING_RANGE = (1, 6)   # 1: response 1 much better ... 6: response 2 much better
PARSE_FAILURE = -100.0   # the verifier's reward for an answer that does not parse
SCORES_SECTION = ("[The Begin of Individual Scores]", "[The End of Individual Scores]")
RANKING_SECTION = ("[The Begin of Ranking Score]", "[The End of Ranking Score]")
AGGREGATIONS = ("mean_score", "win_count")
# Where an RL reward needs a value for a completion whose judgements were answered and
# none parsed: the scale's middle, no preference either way (NeMo-Gym's genrm_compare
# gives a failed parse its default_score 3 and default_ranking 3.5, the midpoint).
NEUTRAL = {"mean_score": 3.0, "win_count": 0.5}

INSTRUCTIONS = """\
You are a skilled little expert at scoring responses. You should evaluate given responses \
based on the given judging criteria.
Given the context of the conversation (the last turn is the User's query) and two \
responses from the Assistant, you need to refer to the [Helpfulness Scoring Guidelines] \
to score each individual response, and to also give a ranking score based on the \
[Ranking Scoring Guidelines].
Before scoring, please analyze step by step. Your scoring needs to be as strict as possible.
"""

GUIDELINES = """
[Helpfulness Scoring Guidelines]

When evaluating Helpfulness, consider the following factors:

- Correctness/Completeness: Is the response accurate and complete?
- Coherence/Clarity: Is the response clear, coherent, and easy to understand?
- Instruction following: Does the response follow the instructions and fulfill the \
user's request?
- Relevance: Is the response relevant to the user's query/input?
- Level of Detail and Creativity: Does the response provide enough detail without being \
too verbose? Does it show creativity but not hallucinations?

**Score 5: Extremely Helpful**

- The response is extremely helpful and completely aligned with the spirit of what the \
prompt was asking for.
- It accurately acts on the user's request, without unnecessary information.
- If a user request is not possible/in line with desired model behavior, a helpful \
response provides useful context and rationale.

**Score 4: Mostly Helpful**

- The response is mostly helpful and mainly aligned with what the user was looking for.
- There is still some room for improvement, but the response is generally useful.

**Score 3: Partially Helpful**

- The response is partially helpful but misses the overall goal of the user's \
query/input in some way.
- The response did not fully satisfy what the user was looking for.

**Score 2: Borderline Unhelpful**

- The response is borderline unhelpful and mostly does not capture what the user was \
looking for.
- However, it is still usable and helpful in a small way.

**Score 1: Not Helpful**

- The response is not useful or helpful at all.
- The response completely missed the essence of what the user wanted.

[Ranking Scoring Guidelines]

Ranking score is used to rank the two responses based on their helpfulness. Even if you \
give the same individual helpfulness score for both responses, you need to \
differentiate them strictly.
The ranking score is a number between 1 and 6, where:
1 = Response 1 is much better than Response 2
2 = Response 1 is better than Response 2
3 = Response 1 is slightly better than Response 2
4 = Response 2 is slightly better than Response 1
5 = Response 2 is better than Response 1
6 = Response 2 is much better than Response 1
"""

OUTPUT_FORMAT = f"""\
#### Output Format Requirements ####
First give your analysis on each responses in the format of:
[The Begin of Analysis on Response i]
Analysis on the i-th response
[The End of Analysis on Response i]

Then give the scores of each response in order, separate by comma in the boxed, \
adhering this format:
{SCORES_SECTION[0]}
\\boxed{{x, y}}
{SCORES_SECTION[1]}

Then give the relative ranking score in the format of:
{RANKING_SECTION[0]}
\\boxed{{z}}
{RANKING_SECTION[1]}"""


@dataclasses.dataclass(frozen=True)
class Judgement:
  """A parsed answer: the individual scores (s1, s2) and the ranking z, each None where
  its box does not parse."""
  scores: tuple[int, int] | None
  ranking: int | None

  @property
  def complete(self) -> bool:
    return self.scores is not None and self.ranking is not None


def transcript(context: Conversation) -> str:
  """The conversation before the responses as "Role: text" paragraphs (the system prompt
  first, as "System:", when there is one)."""
  parts = [f"System: {context.system}"] if context.system else []
  parts += [f"{turn.role}: {turn.text}" for turn in context.turns]
  return "\n\n".join(parts)


SHORT_INSTRUCTIONS = """\
Score the helpfulness of each response from 1 (not helpful) to 5 (extremely helpful), \
then rank them from 1 (Response 1 is much better) to 6 (Response 2 is much better), \
with no tie.
"""

SHORT_FORMAT = f"""\
#### Output Format Requirements ####
{SCORES_SECTION[0]}
\\boxed{{x, y}}
{SCORES_SECTION[1]}
{RANKING_SECTION[0]}
\\boxed{{z}}
{RANKING_SECTION[1]}"""


def prompt(context: Conversation, responses: tuple[str, str],
           guidelines: bool = True) -> str:
  """The judge's prompt for two responses to `context` (a conversation ending in the user
  turn they answer). `guidelines=False` is a short prompt for small models: the scales in
  one sentence and the answer's boxes alone (no guidelines, no analysis asked for)."""
  if len(responses) != 2:
    raise ValueError(f"a GenRM judges two responses, got {len(responses)}")
  one, two = responses
  body = (f"#### Conversation Context ####\n{transcript(context)}\n\n"
          f"#### Responses to be Scored ####\n"
          f"[The Begin of Response 1]\n{one}\n[The End of Response 1]\n"
          f"[The Begin of Response 2]\n{two}\n[The End of Response 2]\n\n")
  if not guidelines:
    return f"{SHORT_INSTRUCTIONS}\n{body}{SHORT_FORMAT}"
  return f"{INSTRUCTIONS}{GUIDELINES}\n{body}{OUTPUT_FORMAT}"


def answer(judgement: Judgement, analysis: Sequence[str] = ()) -> str:
  """An answer in the prompt's format (the analyses, if given, then both boxes): what a
  judge writes, for demos and tests."""
  parts = [f"[The Begin of Analysis on Response {i}]\n{text}\n"
           f"[The End of Analysis on Response {i}]\n" for i, text in enumerate(analysis, 1)]
  s1, s2 = judgement.scores or ("?", "?")
  parts.append(f"{SCORES_SECTION[0]}\n\\boxed{{{s1}, {s2}}}\n{SCORES_SECTION[1]}\n"
               f"{RANKING_SECTION[0]}\n\\boxed{{{judgement.ranking}}}\n{RANKING_SECTION[1]}")
  return "".join(parts)


def last_box(text: str) -> str | None:
  """The content of the last `\\boxed{...}` in `text` with balanced braces, else None."""
  start = text.rfind("\\boxed")
  if start < 0 or not text.startswith("\\boxed{", start):
    return None
  depth = 0
  for i in range(start + len("\\boxed"), len(text)):
    depth += {"{": 1, "}": -1}.get(text[i], 0)
    if depth == 0:
      return text[start + len("\\boxed{"):i]
  return None


def _section(text: str, markers: tuple[str, str]) -> str:
  return text.split(markers[0])[-1].split(markers[1])[0]


_INT = re.compile(r"\s*([+-]?\d+)\s*")


def _integers(box: str | None, count: int, bounds: tuple[int, int]) -> tuple[int, ...] | None:
  if box is None:
    return None
  items = box.split(",")
  matches = [_INT.fullmatch(item) for item in items]
  if len(items) != count or not all(matches):
    return None
  values = tuple(int(m.group(1)) for m in matches)
  return values if all(bounds[0] <= v <= bounds[1] for v in values) else None


def parse(text: str) -> Judgement | None:
  """The scores and ranking of a judge's answer; None when neither box parses."""
  scores = _integers(last_box(_section(text, SCORES_SECTION)), 2, SCORE_RANGE)
  ranking = _integers(last_box(_section(text, RANKING_SECTION)), 1, RANKING_RANGE)
  if scores is None and ranking is None:
    return None
  return Judgement(scores, ranking[0] if ranking else None)  # type: ignore[arg-type]


def check_reference(reference: Any) -> dict:
  """A prompt row's `reference` as {"scores": [h1|None, h2|None], "ranking": int|None};
  ValueError says what is malformed."""
  if not isinstance(reference, Mapping):
    raise ValueError(f"reference must be an object {{scores, ranking}}, got"
                     f" {type(reference).__name__}")
  scores = reference.get("scores", [None, None])
  if not isinstance(scores, (list, tuple)) or len(scores) != 2 or not all(
      s is None or (isinstance(s, (int, float)) and not isinstance(s, bool)) for s in scores):
    raise ValueError(f"reference.scores must be [h1, h2] (numbers or null), got {scores!r}")
  ranking = reference.get("ranking")
  if ranking is not None and (isinstance(ranking, bool) or not isinstance(ranking, int)
                              or not RANKING_RANGE[0] <= ranking <= RANKING_RANGE[1]):
    raise ValueError(f"reference.ranking must be an integer 1-6 or null, got {ranking!r}")
  if ranking is None and None in scores:
    raise ValueError("reference has neither both scores nor a ranking: nothing to check")
  return {"scores": list(scores), "ranking": ranking}


def verifier_reward(text: str, reference: Mapping[str, Any]) -> float:
  """NeMo-Aligner's GenRM verifier: -(|s1-h1| + |s2-h2| + |z-rank|), the score terms only
  where both labels exist, the ranking term where the reference has one; `PARSE_FAILURE`
  unless both boxes parse (`Judgement.complete`)."""
  ref = check_reference(reference)
  judged = parse(text)
  if judged is None or not judged.complete:
    return PARSE_FAILURE
  distance = 0.0
  h1, h2 = ref["scores"]
  if h1 is not None and h2 is not None:
    distance += abs(judged.scores[0] - h1) + abs(judged.scores[1] - h2)
  if ref["ranking"] is not None:
    distance += abs(judged.ranking - ref["ranking"])
  return -float(distance)


def helpfulness_label(mean: float | None) -> int | None:
  """A response's h: the annotators' mean 1-5 helpfulness rounded half up (3.5 -> 4)."""
  return None if mean is None else int(math.floor(float(mean) + 0.5))


def ranking_label(overall_preference: int) -> int | None:
  """HelpSteer3's overall_preference (-3..3, negative: response 1 better) as the 1-6
  ranking: -3..-1 -> 1..3, 1..3 -> 4..6; a tie (0) has none."""
  if not -3 <= overall_preference <= 3:
    raise ValueError(f"overall_preference {overall_preference} is outside -3..3")
  if overall_preference == 0:
    return None
  return overall_preference + 4 if overall_preference < 0 else overall_preference + 3


def swapped(reference: Mapping[str, Any]) -> dict:
  """The reference of the same pair shown in the other order: h swapped, 7 - rank."""
  ref = check_reference(reference)
  ranking = ref["ranking"]
  return {"scores": ref["scores"][::-1],
          "ranking": None if ranking is None else RANKING_RANGE[1] + 1 - ranking}


def aggregate(n: int, pairs: Sequence[tuple[int, int]],
              judgements: Sequence[Judgement | None], how: str = "mean_score") -> np.ndarray:
  """[n] per-completion rewards from judgements of pairs (i, j), i shown as response 1.

  `mean_score`: the mean of a completion's individual scores over the judgements that
  scored it; `win_count`: its wins (ranking 1-3: response 1 wins, 4-6: response 2) per
  judgement that ranked it, in [0, 1]. A pair (i, i), a completion judged against itself,
  counts both sides: the mean of its two scores, one win and one loss (0.5). A judgement
  that does not parse (None, or the part the aggregation reads missing) is skipped; NaN
  where none counted."""
  if how not in AGGREGATIONS:
    raise ValueError(f"aggregation {how!r}: expected one of {', '.join(AGGREGATIONS)}")
  total, count = np.zeros(n, np.float64), np.zeros(n, np.float64)
  for (i, j), judged in zip(pairs, judgements, strict=True):
    if judged is None:
      continue
    if how == "mean_score" and judged.scores is not None:
      values = judged.scores
    elif how == "win_count" and judged.ranking is not None:
      values = (float(judged.ranking <= 3), float(judged.ranking > 3))
    else:
      continue
    for k, value in ((i, values[0]), (j, values[1])):
      total[k] += value
      count[k] += 1
  out = np.full(n, np.nan, np.float32)
  out[count > 0] = total[count > 0] / count[count > 0]
  return out
