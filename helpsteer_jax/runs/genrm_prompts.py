"""GenRM prompts from HelpSteer3 files: each preference row (ties dropped) as a judge
prompt whose `reference` holds its labels, joined with its feedback row.

A preference row and a feedback row are the same pair when their context (system prompt
and turns) and responses are equal; a feedback row with the responses the other way
round gives its helpfulness swapped. h is the feedback's mean helpfulness rounded half
up (`genrm.helpfulness_label`), the ranking is `overall_preference` mapped to 1-6
(`genrm.ranking_label`); a preference row without feedback has scores [null, null]
(the verifier then checks the ranking alone). `both_orders` adds each pair shown the
other way round (h swapped, 7 - rank), as NeMo-RL's GenRM data does.

The feedback is read from `feedback_path`, else from the `feedback/` config beside
`preference/` when the source is the dataset's directory and holds the split.
`write_demo` writes the demo's HelpSteer3 rows and the answer-format examples a small
policy starts from.
"""

from __future__ import annotations

import os
import pathlib
from typing import Sequence

import numpy as np

from helpsteer_jax.data.demo import helpsteer3 as demo_helpsteer3
from helpsteer_jax.data.formats import helpsteer3
from helpsteer_jax.data.formats.rows import BadRecordReport
from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.inference import steering
from helpsteer_jax.judges import genrm

FORMAT_EXAMPLES = demo_helpsteer3.FORMAT_EXAMPLES  # write_demo's HelpSteer-format rows


def _key(conv: Conversation, responses: Sequence[str]) -> tuple:
  return conv.system, tuple((t.role, t.text) for t in conv.turns), tuple(responses)


def feedback_source(source: str, split: str, feedback_path: str = "") -> str:
  """Where the feedback config is: `feedback_path`, else `<source>/feedback` when the
  source is the dataset's directory and it holds `split`; "" when neither."""
  if feedback_path:
    return feedback_path
  path = os.path.join(os.path.expanduser(source), "feedback")
  held = os.path.isdir(path) and any(
      n.startswith(f"{split}.") for n in os.listdir(path))
  return path if held else ""


def labelled_pairs(source: str, split: str, *, feedback_path: str = "",
                   domains: Sequence[str] = (), languages: Sequence[str] = (),
                   on_bad_record: str = "error", report: BadRecordReport | None = None
                   ) -> list[tuple[helpsteer3.Preference, dict]]:
  """(preference record, reference) of every non-tie preference row; bad rows of either
  config per `on_bad_record` (skipped ones counted in `report`)."""
  feedback = {}
  where = feedback_source(source, split, feedback_path)
  if where:
    for record in helpsteer3.read_helpsteer3(where, "feedback", split,
                                             on_bad_record=on_bad_record, report=report):
      h = tuple(genrm.helpfulness_label(m) for m in record.helpfulness)
      feedback[_key(record.context.conversation, record.responses)] = h
      feedback.setdefault(_key(record.context.conversation, record.responses[::-1]), h[::-1])
  out = []
  for record in helpsteer3.read_helpsteer3(source, "preference", split, domains=domains,
                                           languages=languages, on_bad_record=on_bad_record,
                                           report=report):
    ranking = genrm.ranking_label(record.overall)
    if ranking is None:
      continue
    h = feedback.get(_key(record.context.conversation, record.responses), (None, None))
    out.append((record, {"scores": list(h), "ranking": ranking}))
  return out


def read_requests(source: str, split: str, attributes: dict, system: str, *,
                  guidelines: bool = True, both_orders: bool = False,
                  feedback_path: str = "", domains: Sequence[str] = (),
                  languages: Sequence[str] = (), on_bad_record: str = "error",
                  report: BadRecordReport | None = None) -> list[steering.Request]:
  """The judge prompts of `source`'s preference rows as requests: one user turn (the
  prompt), `extra` {"reference", "source"} (the row's file and line); bad rows per
  `on_bad_record` (`labelled_pairs`)."""
  requests = []
  for record, reference in labelled_pairs(source, split, feedback_path=feedback_path,
                                          domains=domains, languages=languages,
                                          on_bad_record=on_bad_record, report=report):
    shown = [(record.responses, reference)]
    if both_orders:
      shown.append((record.responses[::-1], genrm.swapped(reference)))
    for responses, ref in shown:
      text = genrm.prompt(record.context.conversation, responses, guidelines)
      conv = Conversation(system=system, turns=(Turn("User", text),), source=record.source)
      requests.append(steering.Request(text, conv, dict(attributes),
                                       {"reference": ref, "source": record.source}))
  if not requests:
    raise ConfigError(f"{source} ({split}): no HelpSteer3 preference row left (ties are"
                      " dropped; check prompts.domains / prompts.languages)")
  return requests


def _format_rows(source: str, split: str, guidelines: bool, seed: int) -> list[dict]:
  """HelpSteer-format rows (prompt, response, five attributes) whose responses are answers
  in the judge's format with random scores and ranking: the format, not the judgement."""
  rng = np.random.RandomState(seed)
  out = []
  for record, _ in labelled_pairs(source, split):
    judged = genrm.Judgement(tuple(int(v) for v in rng.randint(1, 6, size=2)),
                             int(rng.randint(1, 7)))
    out.append({"prompt": genrm.prompt(record.context.conversation, record.responses,
                                       guidelines),
                "response": genrm.answer(judged), "helpfulness": 4, "correctness": 4,
                "coherence": 4, "complexity": 4, "verbosity": 4})
  return out


def write_demo(out_dir: str | pathlib.Path, num_train: int = 2000, num_validation: int = 200,
               guidelines: bool = False) -> pathlib.Path:
  """The demo's HelpSteer3 configs (`preference/`, `feedback/`) and, in
  `FORMAT_EXAMPLES/`, answer-format rows for an AC-SFT run (short prompts by default)."""
  out = demo_helpsteer3.write_demo_helpsteer3(out_dir, num_train, num_validation)
  demo_helpsteer3.write_format_examples(
      out, lambda split, seed: _format_rows(str(out), split, guidelines, seed))
  return out


if __name__ == "__main__":
  import sys
  print(write_demo(sys.argv[1] if len(sys.argv) > 1 else "workdir/genrm_demo"))
