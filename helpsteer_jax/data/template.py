"""The SteerLM prompt template: the one place its strings are built.

Character for character NeMo-Aligner's SteerLM format (VALUE_TO_TEXT):

  <extra_id_0>System\\n{system}\\n
  <extra_id_1>User\\n{text}\\n
  <extra_id_1>Assistant\\n<extra_id_2>{label}\\n{text}\\n
  <extra_id_1>            (only when the last turn is not of the mask role)

Training, annotation, generation and 2D-DPO all build their strings here.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

from helpsteer_jax.data.records import ATTRIBUTES, MAX_SCORE, MIN_SCORE, Conversation, Turn

DEFAULT_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions.")
SYSTEM_START, TURN_START, LABEL_START = "<extra_id_0>", "<extra_id_1>", "<extra_id_2>"
END_OF_NAME = END_OF_TURN = "\n"
MARKERS = (SYSTEM_START, TURN_START, LABEL_START)
_PROMPT_MARKER = re.compile(r"\n<extra_id_1>(User|Assistant)\n")
_SCORE = re.compile(r"-?[0-9]+")


def label_string(attributes: Mapping[str, int]) -> str:
  """"quality:4,...,verbosity:4" in ATTRIBUTES order; absent attributes left out."""
  unknown = sorted(set(attributes) - set(ATTRIBUTES))
  if unknown:
    raise ValueError(f"unknown attribute(s) {unknown}; known: {', '.join(ATTRIBUTES)}")
  parts = []
  for name in ATTRIBUTES:
    if name in attributes:
      parts.append(f"{name}:{_check_score(name, attributes[name])}")
  return ",".join(parts)


def parse_label_string(label: str) -> dict[str, int]:
  """Inverse of `label_string` ("" -> {}); ValueError says what is malformed."""
  if not isinstance(label, str):
    raise ValueError(f"label must be a string, got {type(label).__name__}")
  if not label.strip():
    return {}
  out: dict[str, int] = {}
  for part in label.split(","):
    name, sep, value = part.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
      raise ValueError(f"malformed label {label!r}: expected 'name:score' pairs"
                       f" joined by ',', got {part!r}")
    if name not in ATTRIBUTES:
      raise ValueError(f"malformed label {label!r}: unknown attribute {name!r}"
                       f" (known: {', '.join(ATTRIBUTES)})")
    if name in out:
      raise ValueError(f"malformed label {label!r}: {name!r} appears twice")
    if not _SCORE.fullmatch(value):
      raise ValueError(f"malformed label {label!r}: score of {name!r} is not an integer:"
                       f" {value!r}")
    out[name] = _check_score(name, int(value))
  return out


def _check_score(name: str, value: object) -> int:
  if isinstance(value, bool) or not isinstance(value, int):
    raise ValueError(f"score of {name!r} must be an int, got {value!r}")
  if not MIN_SCORE <= value <= MAX_SCORE:
    raise ValueError(f"score of {name!r} is {value}, outside {MIN_SCORE}..{MAX_SCORE}")
  return value


@dataclasses.dataclass(frozen=True)
class Piece:
  """A span of the training text; `loss` marks it as a training target."""
  text: str
  loss: bool


def _header(system: str) -> str:
  return f"{SYSTEM_START}System{END_OF_NAME}{system}{END_OF_TURN}"


def _label_part(label: str | None) -> str:
  return "" if label is None else f"{LABEL_START}{label}{END_OF_NAME}"


def _turn_text(turn: Turn, with_label: bool = True) -> str:
  label = _label_part(turn.label) if with_label else ""
  return f"{TURN_START}{turn.role}{END_OF_NAME}{label}{turn.text}{END_OF_TURN}"


def sft_pieces(conv: Conversation) -> list[Piece]:
  """The full attribute-conditioned SFT text, split by loss flag.

  Follows NeMo's `_mask_targets` for VALUE_TO_TEXT (a turn marked
  `trainable=False` and the marker after it carry no loss): the header and turn 0
  carry no loss; a turn not of the mask role carries loss on its text and
  END_OF_TURN but not on its name or label prefix; a mask-role turn after
  turn 1 carries loss only on its leading TURN_START (the end-of-response
  signal of the turn before), and the trailing TURN_START carries loss.
  The name and label prefixes stay separate pieces: `tokenize_pieces` uses
  them to find the last response's header that truncation must keep.
  """
  pieces = [Piece(_header(conv.system), False)]
  trained_previous = False
  for i, turn in enumerate(conv.turns):
    if turn.role == conv.mask_role and i > 1:
      pieces += [Piece(TURN_START, trained_previous), Piece(f"{turn.role}{END_OF_NAME}", False)]
    else:
      pieces.append(Piece(f"{TURN_START}{turn.role}{END_OF_NAME}", False))
    if turn.label is not None:
      pieces.append(Piece(_label_part(turn.label), False))
    trains = turn.role != conv.mask_role and i > 0 and turn.trainable
    pieces.append(Piece(f"{turn.text}{END_OF_TURN}", trains))
    trained_previous = trains
  if conv.turns and conv.turns[-1].role != conv.mask_role:
    pieces.append(Piece(TURN_START, trained_previous))
  return pieces


def sft_text(conv: Conversation) -> str:
  """The full SFT text (the pieces joined)."""
  return "".join(p.text for p in sft_pieces(conv))


def generation_prompt(conv: Conversation, attributes: Mapping[str, int]) -> str:
  """History, then "<extra_id_1>Assistant\\n<extra_id_2>{label}\\n" to continue.

  A final assistant turn (the response being regenerated) is left out;
  earlier turns keep their labels, as in training.
  """
  turns = conv.turns
  if turns and turns[-1].role != conv.mask_role:
    turns = turns[:-1]
  history = "".join(_turn_text(t) for t in turns)
  return (f"{_header(conv.system)}{history}{TURN_START}Assistant{END_OF_NAME}"
          f"{_label_part(label_string(attributes))}")


def follow_up_text(user: str, attributes: Mapping[str, int]) -> str:
  """What `generation_prompt` adds after an answer and its END_OF_TURN when `user` speaks
  next: the user turn, then the assistant's header and label to continue."""
  return (f"{_turn_text(Turn('User', user))}{TURN_START}Assistant{END_OF_NAME}"
          f"{_label_part(label_string(attributes))}")


def regression_pieces(conv: Conversation) -> list[Piece]:
  """NeMo's regression reward-model input for the last assistant turn, in pieces.

  As NeMo-Aligner's process_to_regression_format: system, every turn without
  its label, then LABEL_START (the RM reads its scores there); no EOS. The
  last response and LABEL_START are flagged (`loss=True`) so that left
  truncation keeps them with the response's header; nothing is trained on
  tokens.
  """
  if not conv.turns or conv.turns[-1].role == conv.mask_role:
    raise ValueError(f"{conv.source or 'conversation'}: the last turn must be a response"
                     f" (not of the mask role {conv.mask_role!r}) to score it")
  *context, last = conv.turns
  prefix = _header(conv.system) + "".join(_turn_text(t, with_label=False) for t in context)
  return [Piece(prefix, False), Piece(f"{TURN_START}{last.role}{END_OF_NAME}", False),
          Piece(f"{last.text}{END_OF_TURN}", True), Piece(LABEL_START, True)]


def regression_text(conv: Conversation) -> str:
  """The regression input text (`regression_pieces` joined)."""
  return "".join(p.text for p in regression_pieces(conv))


def parse_regression_text(text: str) -> Conversation:
  """The conversation whose `regression_text` is `text` (ValueError if there is none): how a
  text in the attribute model's input format becomes what scorers take."""
  header = f"{SYSTEM_START}System{END_OF_NAME}"
  if not text.startswith(header) or not text.endswith(f"{END_OF_TURN}{LABEL_START}"):
    raise ValueError(f"not an attribute-model input: expected {header!r}, the turns, then"
                     f" the response and {LABEL_START!r}")
  system, *parts = _PROMPT_MARKER.split(text[len(header):-len(LABEL_START) - 1])
  turns = tuple(Turn(role, body) for role, body in zip(parts[0::2], parts[1::2]))
  conv = Conversation(system, turns)
  if not turns or turns[-1].role != "Assistant" or regression_text(conv) != text:
    raise ValueError("not an attribute-model input: expected a conversation ending in an"
                     f" assistant turn and {LABEL_START!r}")
  return conv


def parse_chat_text(text: str) -> Conversation:
  """The conversation of a rendered SteerLM chat that ends in a response, without labels
  (what an attribute model scores); ValueError if `text` is none.

  Either the attribute model's own input (`regression_text`) or the chat as a SteerLM
  policy renders it, its prompt and answer decoded (`sft_text`'s form: assistant turns
  may carry their `<extra_id_2>label` line; the closing END_OF_TURN and TURN_START of the
  last response are optional, as a decode stops at either).
  """
  if text.endswith(f"{END_OF_TURN}{LABEL_START}"):
    return parse_regression_text(text)
  header = f"{SYSTEM_START}System{END_OF_NAME}"
  if not text.startswith(header):
    raise ValueError(f"not a SteerLM chat: expected {header!r}, the turns, then a response")
  body = text[len(header):].removesuffix(TURN_START).removesuffix(END_OF_TURN)
  system, *parts = _PROMPT_MARKER.split(body)
  turns = []
  for role, part in zip(parts[0::2], parts[1::2]):
    if role == "Assistant" and part.startswith(LABEL_START):
      label, sep, part = part[len(LABEL_START):].partition(END_OF_NAME)
      if not sep:
        raise ValueError(f"not a SteerLM chat: an assistant's {LABEL_START!r} label line"
                         " has no end")
      parse_label_string(label)
    turns.append(Turn(role, part))
  if not turns or turns[-1].role != "Assistant":
    raise ValueError("not a SteerLM chat: expected a conversation ending in an assistant"
                     " turn")
  return Conversation(system, tuple(turns))


def split_helpsteer_prompt(prompt: str) -> list[Turn]:
  """Splits a HelpSteer2 multi-turn prompt into unlabelled turns.

  HelpSteer2 joins earlier turns into `prompt` as
  "{user 1}\\n<extra_id_1>Assistant\\n{assistant 1}\\n<extra_id_1>User\\n{user 2}";
  the split is lossless: templating the turns gives back the same text.
  The earlier assistant turns are context, not targets (`trainable=False`):
  NeMo-Aligner's HelpSteer2 preprocessing keeps the whole prompt as one
  user turn, so only the final, scored response carries loss.
  """
  parts = _PROMPT_MARKER.split(prompt)
  turns = [Turn("User", parts[0])]
  for role, text in zip(parts[1::2], parts[2::2]):
    turns.append(Turn(role, text, trainable=role != "Assistant"))
  return turns
