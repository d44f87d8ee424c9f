"""A GenRM's pairwise comparison through /v1/chat/completions, in the shape NeMo-RL's
GenRM reward sends it.

NeMo-RL reaches a GenRM at an OpenAI-compatible base URL through NeMo-Gym
(`resources_servers/genrm_compare` posting through `responses_api_models/genrm_model`,
whose `GenRMModelMixin` appends the comparison's roles), which posts

  {"model": name, "max_tokens": n, "temperature": t, "top_p": p,
   "messages": [<the conversation: a system message?, user, assistant, ..., user>,
                {"role": "response_1", "content": r1},
                {"role": "response_2", "content": r2}]}

and reads the last JSON object of `choices[0].message.content` with `score_1`,
`score_2` and `ranking` (its `parse_genrm_output`). Such a request is asked as this
project's GenRM prompt (`judges.genrm.prompt`: the conversation as its transcript, then
both responses; `scorer.judge_guidelines` picks the full or the short form), the one
user turn of a chat in the served model's system prompt and attributes: the prompt a
local judge (`inference.judge.EngineAnswers`) renders for the same pair. The answer is
the judge's text, then, when its boxes parse, one JSON line of what parsed.
"""

from __future__ import annotations

import json

from helpsteer_jax.judges import genrm
from helpsteer_jax.serve import protocol

RESPONSE_ROLES = ("response_1", "response_2")
PRINCIPLE_ROLE = "principle"  # NeMo-Gym's use_principle: a principle-based GenRM's
ROLES = (*RESPONSE_ROLES, PRINCIPLE_ROLE)


def judge_prompt(messages: list[protocol.Message], guidelines: bool) -> str | None:
  """The GenRM prompt of a request whose messages end in `response_1` then `response_2`;
  None for a chat without those roles. A 400 for a principle (this GenRM's prompt has
  none), the roles elsewhere, or a conversation that does not end in the user's turn."""
  roles = [m.role for m in messages]
  if not set(roles) & set(ROLES):
    return None
  if PRINCIPLE_ROLE in roles:
    where = f"messages.{roles.index(PRINCIPLE_ROLE)}"
    raise protocol.ApiError(f"{where}: this GenRM's prompt has no principle (NeMo-Gym's"
                            " genrm_compare: use_principle: false)", param=where)
  if len(roles) < 3 or tuple(roles[-2:]) != RESPONSE_ROLES or sum(
      r in ROLES for r in roles) != 2:
    raise protocol.ApiError("messages: a GenRM comparison is the conversation (ending in the"
                            " user's turn), then one 'response_1' and one 'response_2'"
                            " message", param="messages")
  context = protocol.conversation(messages[:-2], system="")
  return genrm.prompt(context, (messages[-2].text(), messages[-1].text()), guidelines)


def answer_text(text: str) -> str:
  """The judge's answer, then, when its boxes parse, `{"score_1", "score_2", "ranking"}`
  (the parts that parsed) as one JSON line: the form NeMo-Gym's parser reads."""
  judged = genrm.parse(text)
  if judged is None:
    return text
  fields: dict[str, int] = {}
  if judged.scores is not None:
    fields.update(score_1=judged.scores[0], score_2=judged.scores[1])
  if judged.ranking is not None:
    fields["ranking"] = judged.ranking
  return f"{text}\n{json.dumps(fields)}"
