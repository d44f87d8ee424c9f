"""Steering requests: attribute values, prompts from files or stdin, SteerLM prompts.

`steer_attributes` selects which attributes the label string carries: a
model answers to the label format it was trained on (all nine for OASST +
HelpSteer SteerLM models, the five HelpSteer ones for models trained on
HelpSteer rows only). Precedence, name by name: the config (a non-empty
`steer_attributes`, a set `config.steer.<name>`), then the model's own
`steerlm` section (what AC-SFT and 2D-DPO exports carry; one that declares no
attributes, an export trained without labels, gets none: an empty label, as its
training rendered its prompts), then, for a model without that section, all nine
names with NeMo's SteerLM inference values (quality 4, toxicity 0, humor 0,
creativity 0, and 4 for the five HelpSteer attributes). Prompts are built by
`data.template.generation_prompt`, the formatter AC-SFT training uses, and
`encode_prompt` is the one way they become token ids (the engine's tasks, RL,
the rounds, the server).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from typing import Any, Iterator, Mapping, TextIO

import ml_collections

from helpsteer_jax.data import template
from helpsteer_jax.data.chat_template import NEMO_DEFAULTS, SteerSpec
from helpsteer_jax.data.features import tokenize
from helpsteer_jax.data.formats.rows import (
  BadRecord,
  BadRecordReport,
  iter_checked_rows,
  iter_json_lines,
)
from helpsteer_jax.data.records import (
  ANSWER_KEY,
  ATTRIBUTES,
  HELPSTEER_ATTRIBUTES,
  Conversation,
)
from helpsteer_jax.errors import ConfigError

ATTRIBUTE_SETS = {"all": ATTRIBUTES, "helpsteer": HELPSTEER_ATTRIBUTES}
_ROW_KEYS = ("prompt", "turns", "attributes", "system")
# An input row's own answer and its labels (a HelpSteer2 row's) describe another response
# than the one generated for it: not copied to the output, where they would pass for its.
_ANSWER_KEYS = ("response", *ATTRIBUTES)


def attribute_names(spec: str) -> tuple[str, ...]:
  """"all", "helpsteer" or a comma-separated list of attribute names."""
  if spec in ATTRIBUTE_SETS:
    return ATTRIBUTE_SETS[spec]
  names = tuple(n.strip() for n in spec.split(",") if n.strip())
  unknown = [n for n in names if n not in ATTRIBUTES]
  if unknown or not names:
    raise ConfigError(f"steer_attributes={spec!r}: unknown attribute(s) {unknown}; use"
                      f" 'all', 'helpsteer' or names from {', '.join(ATTRIBUTES)}")
  return names


def checked(values: Mapping[str, Any]) -> dict[str, int]:
  """Attribute values in canonical order; ValueError names an unknown one or a bad score."""
  template.label_string(values)  # raises on unknown names and scores outside 0..4
  return {name: int(values[name]) for name in ATTRIBUTES if name in values}


def run_attributes(config: ml_collections.ConfigDict,
                   model: SteerSpec | None = None) -> dict[str, int]:
  """The run's attribute values: names from `steer_attributes`, else the model's
  steerable ones (none for a model whose `steerlm` section declares none: an export
  trained without labels, whose prompts carry an empty label), else, for a model
  without a section, all nine; each value from `config.steer`, else the model's
  default, else NeMo's."""
  if config.steer_attributes:
    names = attribute_names(config.steer_attributes)
  elif model is not None:
    names = model.attributes
  else:
    names = ATTRIBUTES
  model_defaults = model.defaults if model is not None else {}
  values = {}
  for name in names:
    value = config.steer[name]
    values[name] = value if value is not None else model_defaults.get(name, NEMO_DEFAULTS[name])
  try:
    return checked(values)
  except ValueError as e:
    raise ConfigError(f"config.steer: {e}") from None


@dataclasses.dataclass
class Request:
  """One prompt to answer: the conversation so far and the attributes to ask for.

  `extra` holds the input row's other fields (e.g. an id; not its own response or
  attribute labels), copied to the output. `follow_ups`: user turns to ask after the
  answer, in order (MT-Bench's later questions; multi-turn RL answers them, `rl.multiturn`).
  """

  prompt: str
  conversation: Conversation
  attributes: dict[str, int]
  extra: dict = dataclasses.field(default_factory=dict)
  follow_ups: tuple[str, ...] = ()

  def prompt_text(self) -> str:
    return template.generation_prompt(self.conversation, self.attributes)

  def prompt_ids(self, tokenizer: Any, add_bos: bool = True) -> list[int]:
    """The prompt's ids [L] (`encode_prompt` of `prompt_text`)."""
    return encode_prompt(self.prompt_text(), tokenizer, add_bos)

  def output_row(self, response: str, **fields: Any) -> dict:
    return {"prompt": self.prompt, "attributes": self.attributes, "response": response,
            **self.extra, **fields}

  @staticmethod
  def matches(row: dict, request: Request) -> bool:
    """Whether an output `row` answers `request` (the same prompt, attributes and extra
    fields; a `resume` match)."""
    return all(row.get(k) == v for k, v in request.output_row("").items() if k != "response")

  def answered(self, response: str, output: Any = None) -> Conversation:
    """The conversation with `response` as its last (assistant) turn, carrying the row's
    `reference` (what a rule-based reward checks the answer against), if any, with the
    engine's `output` that wrote the response under `records.ANSWER_KEY`."""
    conv = self.conversation.answered(response)
    reference = self.extra.get("reference")
    if reference is None:
      return conv
    if output is not None:
      reference = {**reference, ANSWER_KEY: output}
    return dataclasses.replace(conv, reference=reference)


def make_request(prompt: str, attributes: Mapping[str, int],
                 system: str = template.DEFAULT_SYSTEM, extra: dict | None = None) -> Request:
  """A request for `prompt` (HelpSteer2-style turn markers split into turns)."""
  if not isinstance(prompt, str) or not prompt.strip():
    raise ValueError("the prompt is empty")
  turns = tuple(template.split_helpsteer_prompt(prompt))
  conv = Conversation(system=system, turns=turns, mask_role="User")
  return Request(prompt, conv, checked(attributes), dict(extra or {}))


def encode_prompt(text: str, tokenizer: Any, add_bos: bool = True) -> list[int]:
  """A rendered prompt's ids exactly as AC-SFT training tokenizes text (BOS, one call)."""
  return tokenize.tokenize_pieces([template.Piece(text, False)], tokenizer,
                                  add_bos=add_bos).ids.tolist()


def response_text(text: str, finish_reason: str) -> str:
  """The answer without the turn's END_OF_TURN that precedes the stop marker."""
  return text.removesuffix(template.END_OF_TURN) if finish_reason == "stop" else text


def _row_attributes(row: Mapping, defaults: Mapping[str, int]) -> dict[str, int]:
  given = row.get("attributes")
  if given is None:
    return dict(defaults)
  if isinstance(given, str):
    given = template.parse_label_string(given)
  if not isinstance(given, Mapping):
    raise ValueError(f"'attributes' must be an object or a label string, got"
                     f" {type(given).__name__}")
  return {**defaults, **given}


def _row_prompt(row: Mapping) -> tuple[str, tuple[str, ...]]:
  """A row's prompt and follow-up user turns: `prompt`, or FastChat's MT-Bench `turns`
  (a list of user turns, the first one the prompt)."""
  if "prompt" in row:
    return row["prompt"], ()
  turns = row.get("turns")
  if turns is None:
    raise ValueError("missing field 'prompt' (or 'turns', a list of user turns)")
  if (not isinstance(turns, list) or not turns
          or not all(isinstance(t, str) and t.strip() for t in turns)):
    raise ValueError("'turns' must be a non-empty list of non-empty strings")
  return turns[0], tuple(turns[1:])


def _json_request(row: Mapping, where: str, defaults, system) -> Request:
  """One JSONL row's request (`where`: its file and line); BadRecord says what is wrong."""
  try:
    prompt, follow_ups = _row_prompt(row)
    extra = {k: v for k, v in row.items() if k not in _ROW_KEYS + _ANSWER_KEYS}
    request = make_request(prompt, _row_attributes(row, defaults),
                           row.get("system") or system, extra)
  except ValueError as e:
    raise BadRecord(str(e)) from None
  return dataclasses.replace(request, follow_ups=follow_ups, conversation=dataclasses.replace(
      request.conversation, source=where))


def _text_request(text: str, where: str, defaults, system) -> Request:
  """One text line's request."""
  try:
    return make_request(text.rstrip("\n"), defaults, system)
  except ValueError as e:
    raise BadRecord(str(e)) from None


def _stdin_rows(stream: TextIO) -> Iterator[tuple[int, Any]]:
  for i, line in enumerate(stream, 1):
    if line.strip():
      try:
        yield i, json.loads(line)
      except json.JSONDecodeError as e:
        yield i, e


def _text_rows(lines) -> Iterator[tuple[int, str]]:
  return ((i, text) for i, text in enumerate(lines, 1) if text.strip())


def read_requests(source: str, defaults: Mapping[str, int],
                  system: str = template.DEFAULT_SYSTEM,
                  stdin: TextIO | None = None, on_bad_record: str = "error",
                  report: BadRecordReport | None = None) -> list[Request]:
  """Requests from a jsonl file (`{"prompt": ..., "attributes": {...}}` per line),
  a text file (one prompt per line; blank lines are skipped) or "-" (stdin,
  jsonl when the first line starts with "{", else text). A bad row raises `DataError`
  naming the file and line, or with `on_bad_record="skip"` is skipped and counted in
  `report` (`data.formats.rows.iter_checked_rows`)."""
  if source == "-":
    stream = stdin or sys.stdin
    lines = stream.read().splitlines(keepends=True)
    json_rows = next((line for line in lines if line.strip()), "").lstrip().startswith("{")
    rows, build = ((_stdin_rows(lines), _json_request) if json_rows
                   else (_text_rows(lines), _text_request))
    where = "<stdin>"
  else:
    path = pathlib.Path(source)
    if not path.is_file():
      raise ConfigError(f"input {source} is not a file; give a .jsonl or text file, or '-'"
                        " for stdin")
    where = str(path)
    if path.name.endswith((".jsonl", ".jsonl.gz")):
      rows, build = iter_json_lines(path), _json_request
    else:
      with open(path, encoding="utf-8") as f:
        rows, build = list(_text_rows(f)), _text_request
  return [request for _, request in iter_checked_rows(
      rows, where, lambda row, at: build(row, at, defaults, system), on_bad_record, report)]
