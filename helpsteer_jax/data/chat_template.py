"""The SteerLM format as a Jinja chat template, and the `steerlm` section of an HF export.

AC-SFT and 2D-DPO exports carry this template in their tokenizer (the
`chat_template.jinja` file transformers 5 writes, and the `chat_template`
key of `tokenizer_config.json` that earlier versions read), so that
`apply_chat_template` and OpenAI-compatible servers (vLLM, SGLang) build
exactly the prompts of `template.generation_prompt`. Template variables:

  attributes  {"verbosity": 1, ...} or "verbosity:1,...": scores 0..4 of the
              response to generate, merged over the model's defaults and
              written in canonical (ATTRIBUTES) order
  a message's "label" (same two forms, no defaults merged): the label of that
              turn, as history turns carry theirs in training; a turn without
              one has no label line. Without `add_generation_prompt`, a final
              assistant message without its own label takes `attributes`
              (the response being continued).

The first message may be the system prompt; without one the template uses
`template.DEFAULT_SYSTEM`. Unknown names, scores outside 0..4, other roles
and non-text content raise `raise_exception`. The model's steerable
attributes and their defaults are baked into the template and also stored
as `config.json`'s `steerlm` section (`SteerSpec`), which
`from_pretrained` / `save_pretrained` keep (generation_config.json drops
unknown keys) and `generate` reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Iterable, Mapping

from helpsteer_jax.data import template
from helpsteer_jax.data.records import ATTRIBUTES, MAX_SCORE, MIN_SCORE, Conversation
from helpsteer_jax.errors import ConfigError

# NeMo-Aligner's SteerLM inference values (quality 4, toxicity 0, humor 0,
# creativity 0, and 4 for the five HelpSteer attributes).
NEMO_DEFAULTS = {"quality": 4, "toxicity": 0, "humor": 0, "creativity": 0,
                 "helpfulness": 4, "correctness": 4, "coherence": 4, "complexity": 4,
                 "verbosity": 4}
SECTION = "steerlm"  # the key in an export's config.json
TEMPLATE_FILE = "chat_template.jinja"


@dataclasses.dataclass(frozen=True)
class SteerSpec:
  """A model's steerable attributes (canonical order) and their default scores."""

  attributes: tuple[str, ...]
  defaults: Mapping[str, int]

  def __post_init__(self):
    names = tuple(self.attributes)
    if names != tuple(n for n in ATTRIBUTES if n in names):
      raise ValueError(f"attributes {list(names)} must be distinct names from"
                       f" {', '.join(ATTRIBUTES)}, in that order")
    if set(self.defaults) != set(names):
      raise ValueError(f"defaults {dict(self.defaults)} must give one score for each of"
                       f" {list(names)}")
    template.label_string(self.defaults)  # unknown names, scores outside 0..4
    object.__setattr__(self, "attributes", names)
    object.__setattr__(self, "defaults", {n: int(self.defaults[n]) for n in names})

  @classmethod
  def nemo(cls, names: Iterable[str]) -> SteerSpec:
    """`names` with NeMo's inference defaults."""
    names = set(names)
    return cls(tuple(n for n in ATTRIBUTES if n in names),
               {n: NEMO_DEFAULTS[n] for n in ATTRIBUTES if n in names})

  @classmethod
  def from_label(cls, label: str) -> SteerSpec:
    """The attributes of a label string, its scores as the defaults."""
    scores = template.parse_label_string(label)
    return cls(tuple(n for n in ATTRIBUTES if n in scores), scores)

  def section(self) -> dict:
    return {"attributes": list(self.attributes), "defaults": dict(self.defaults)}


NO_LABELS = SteerSpec((), {})


def trained_attributes(conversations: Iterable[Conversation]) -> SteerSpec:
  """The attributes the labels of `conversations` carry, with NeMo's defaults."""
  names: set[str] = set()
  for conv in conversations:
    for turn in conv.turns:
      if turn.label:
        names.update(template.parse_label_string(turn.label))
  return SteerSpec.nemo(names)


ADAPTER_SPEC_FILE = "steerlm.json"  # a PEFT adapter's: LoraConfig warns on unknown keys
# Where a directory's spec may be, in order: an HF model's config.json section, a PEFT
# adapter's own file, and the adapter_config.json section of earlier adapter exports.
SPEC_PLACES = (("config.json", SECTION), (ADAPTER_SPEC_FILE, None),
               ("adapter_config.json", SECTION))


def read_spec(hf_dir: str | os.PathLike) -> SteerSpec | None:
  """The steering spec of an export: its config.json's `steerlm` section (a model) or
  its steerlm.json (a PEFT adapter); None when it has neither."""
  for name, key in SPEC_PLACES:
    path = pathlib.Path(hf_dir).expanduser() / name
    if not path.is_file():
      continue
    try:
      content = json.loads(path.read_text())
      section = content if key is None else content.get(key)
    except (json.JSONDecodeError, AttributeError) as e:
      raise ConfigError(f"{path}: not a JSON object ({e})") from None
    if section is None:
      return None
    try:
      return SteerSpec(tuple(section["attributes"]), section["defaults"])
    except (TypeError, KeyError, ValueError) as e:
      raise ConfigError(f"{path}: malformed '{SECTION}' section ({e}); expected"
                        ' {"attributes": [names], "defaults": {name: 0..4}}') from None
  return None


def _lit(value) -> str:
  """A Jinja literal (JSON strings, lists and objects of strings / ints are valid Jinja)."""
  return json.dumps(value, ensure_ascii=True)


_BODY = """\
{%- macro steer_label(value, base, what) -%}
  {%- set given = namespace(names=[], scores=[]) -%}
  {%- if value is none -%}
  {%- elif value is string -%}
    {%- if value | trim -%}
      {%- for part in value.split(",") -%}
        {%- set pair = part.split(":") -%}
        {%- if pair | length != 2 or not pair[0] | trim or not pair[1] | trim -%}
          {{- raise_exception("SteerLM chat template: malformed " ~ what ~ " " ~ value
              ~ ": expected name:score pairs joined by ',', got '" ~ part ~ "'") -}}
        {%- endif -%}
        {%- if pair[1] | trim not in SCORES | map("string") | list -%}
          {{- raise_exception("SteerLM chat template: score of '" ~ pair[0] | trim ~ "' in "
              ~ what ~ " is " ~ pair[1] | trim ~ "; use an integer " ~ SCORES | first ~ ".."
              ~ SCORES | last) -}}
        {%- endif -%}
        {%- set given.names = given.names + [pair[0] | trim] -%}
        {%- set given.scores = given.scores + [pair[1] | trim | int] -%}
      {%- endfor -%}
    {%- endif -%}
  {%- elif value is mapping -%}
    {%- for name in value -%}
      {%- set given.names = given.names + [name] -%}
      {%- set given.scores = given.scores + [value[name]] -%}
    {%- endfor -%}
  {%- else -%}
    {{- raise_exception("SteerLM chat template: " ~ what
        ~ " must be an object {name: score} or a label string 'name:score,...'") -}}
  {%- endif -%}
  {%- for name in given.names -%}
    {%- set score = given.scores[loop.index0] -%}
    {%- if name not in NAMES -%}
      {{- raise_exception("SteerLM chat template: unknown attribute '" ~ name ~ "' in "
          ~ what ~ "; known: " ~ NAMES | join(", ")) -}}
    {%- endif -%}
    {%- if name in given.names[:loop.index0] -%}
      {{- raise_exception("SteerLM chat template: '" ~ name ~ "' appears twice in " ~ what) -}}
    {%- endif -%}
    {%- if not (score is integer and score in SCORES) -%}
      {{- raise_exception("SteerLM chat template: score of '" ~ name ~ "' in " ~ what ~ " is "
          ~ score ~ "; use an integer " ~ SCORES | first ~ ".." ~ SCORES | last) -}}
    {%- endif -%}
  {%- endfor -%}
  {%- set out = namespace(parts=[]) -%}
  {%- for name in NAMES -%}
    {%- set pick = namespace(score=base[name] if name in base else none) -%}
    {%- for other in given.names -%}
      {%- if other == name -%}
        {%- set pick.score = given.scores[loop.index0] -%}
      {%- endif -%}
    {%- endfor -%}
    {%- if pick.score is not none -%}
      {%- set out.parts = out.parts + [name ~ ":" ~ pick.score] -%}
    {%- endif -%}
  {%- endfor -%}
  {{- out.parts | join(",") -}}
{%- endmacro -%}
{%- if messages and messages[0].role == "system" -%}
  {%- set system = messages[0].content -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set system = DEFAULT_SYSTEM -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- if system is not string -%}
  {{- raise_exception("SteerLM chat template: the system message's content must be text") -}}
{%- endif -%}
{%- set generation = add_generation_prompt is defined and add_generation_prompt -%}
{%- set steer = steer_label(attributes if attributes is defined else none, DEFAULTS,
    "attributes") -%}
BOS
{{- SYSTEM_START ~ "System" ~ END_OF_NAME ~ system ~ END_OF_TURN -}}
{%- for message in turns -%}
  {%- if message.role == "user" -%}
    {%- set role = "User" -%}
  {%- elif message.role == "assistant" -%}
    {%- set role = "Assistant" -%}
  {%- else -%}
    {{- raise_exception("SteerLM chat template: message role '" ~ message.role
        ~ "'; use user and assistant turns after an optional first system message") -}}
  {%- endif -%}
  {%- if message.content is not string -%}
    {{- raise_exception("SteerLM chat template: the content of a " ~ message.role
        ~ " message must be text") -}}
  {%- endif -%}
  {%- set own = message.label if message.label is defined else none -%}
  {{- TURN_START ~ role ~ END_OF_NAME -}}
  {%- if own is not none -%}
    {{- LABEL_START ~ steer_label(own, {}, "the label of a message") ~ END_OF_NAME -}}
  {%- elif role == "Assistant" and loop.last and not generation and steer -%}
    {{- LABEL_START ~ steer ~ END_OF_NAME -}}
  {%- endif -%}
  {{- message.content ~ END_OF_TURN -}}
{%- endfor -%}
{%- if generation -%}
  {{- TURN_START ~ "Assistant" ~ END_OF_NAME -}}
  {%- if steer -%}
    {{- LABEL_START ~ steer ~ END_OF_NAME -}}
  {%- endif -%}
{%- elif turns and turns[-1].role == "assistant" -%}
  {{- TURN_START -}}
{%- endif -%}
"""


def chat_template(spec: SteerSpec, add_bos: bool = True) -> str:
  """The Jinja chat template for a model steered by `spec`.

  `add_bos` starts the text with the tokenizer's BOS token (when it has
  one), as training and `generate` do: servers tokenize a rendered chat
  without adding special tokens.
  """
  constants = {
      "NAMES": list(ATTRIBUTES), "DEFAULTS": dict(spec.defaults),
      "SCORES": list(range(MIN_SCORE, MAX_SCORE + 1)), "DEFAULT_SYSTEM": template.DEFAULT_SYSTEM,
      "SYSTEM_START": template.SYSTEM_START, "TURN_START": template.TURN_START,
      "LABEL_START": template.LABEL_START, "END_OF_NAME": template.END_OF_NAME,
      "END_OF_TURN": template.END_OF_TURN}
  steerable = ", ".join(spec.attributes) or "none (trained without labels)"
  header = [
      "{#- SteerLM chat template (NeMo-Aligner's VALUE_TO_TEXT format), written by",
      "    helpsteer-jax. Steer with chat_template_kwargs: attributes = {\"verbosity\": 1}",
      "    or \"verbosity:1,...\" (scores 0..4; the others keep their defaults).",
      f"    Steerable attributes: {steerable}. -#}}"]
  lines = [f"{{%- set {name} = {_lit(value)} -%}}" for name, value in constants.items()]
  bos = ("{%- if bos_token is defined and bos_token -%}{{- bos_token -}}{%- endif -%}"
         if add_bos else "")
  return "\n".join(header + lines) + "\n" + _BODY.replace("BOS\n", bos + "\n" if bos else "")


MARKERS = template.MARKERS


def split_markers(tokenizer) -> list[str]:
  """The SteerLM markers that `tokenizer` encodes as more than one token, in MARKERS order."""
  return [m for m in MARKERS
          if len(tokenizer(m, add_special_tokens=False)["input_ids"]) != 1]


def add_marker_tokens(tokenizer) -> list[str]:
  """Adds the markers `tokenizer` splits as special tokens; returns them.

  Their ids follow the tokenizer's last one in MARKERS order, so every run
  (and every process) that augments the same tokenizer gets the same ids.
  A model can then end its turn with one id, which engines stop at when it
  is among generation_config.json's EOS ids (`export_files`).
  """
  added = split_markers(tokenizer)
  if added:
    tokenizer.add_special_tokens({"extra_special_tokens": added},
                                 replace_extra_special_tokens=False)
  return added


def turn_marker_id(tokenizer) -> int | None:
  """The id of the turn marker `<extra_id_1>` when the tokenizer has it as one token."""
  ids = tokenizer(template.TURN_START, add_special_tokens=False)["input_ids"]
  return int(ids[0]) if len(ids) == 1 else None


def export_files(spec: SteerSpec, out_dir: str | os.PathLike, add_bos: bool = True,
                 turn_marker: int | None = None) -> None:
  """Writes the template into an HF directory's tokenizer files and `spec` into its config.json.

  The template goes to `chat_template.jinja` (transformers >= 4.50 prefer
  it) and to `tokenizer_config.json`'s `chat_template` when that file exists
  (older readers); a copied `chat_template.json` of the base model would be
  stale and is removed. `spec` goes to config.json's `steerlm` section (a
  model) or to steerlm.json (a PEFT adapter: PEFT's LoraConfig warns about
  keys it does not know). `turn_marker` (`turn_marker_id`) joins the EOS ids
  of `generation_config.json`: a SteerLM model ends its turn by starting the
  next one, and transformers' `generate` and vLLM stop at those ids.
  """
  out = pathlib.Path(out_dir)
  text = chat_template(spec, add_bos)
  (out / TEMPLATE_FILE).write_text(text, encoding="utf-8")
  (out / "chat_template.json").unlink(missing_ok=True)
  updates = [("tokenizer_config.json", lambda c: {"chat_template": text})]
  updates.append(("config.json", lambda c: {SECTION: spec.section()}))
  if (out / "adapter_config.json").is_file():
    (out / ADAPTER_SPEC_FILE).write_text(json.dumps(spec.section(), indent=2) + "\n",
                                         encoding="utf-8")
  if turn_marker is not None:
    updates.append(("generation_config.json", lambda c: {
        "eos_token_id": _with_id(c.get("eos_token_id"), turn_marker)}))
  for name, update in updates:
    path = out / name
    if path.is_file():
      content = json.loads(path.read_text(encoding="utf-8"))
      content.update(update(content))
      path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _with_id(eos: int | list[int] | None, extra: int) -> list[int]:
  ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
  return ids if extra in ids else ids + [extra]
