"""The principle judge's CPU demo (docs/tasks/principle_rm.md "Demo"): the demo's
principle rows, whose verdicts are re-derived here from the response text alone, read by
`prompts.format=principle`; the answer-format examples answer those very prompts as the
RL task renders them. The demo's commands themselves (the AC-SFT run, `rl:principle`
from it) are run by `benchmarks/demo_figures.py --only principle-rm`, which writes and
checks the guide's tables."""

import gzip
import json
import re
import string

from helpsteer_jax.configs import rl as rl_config
from helpsteer_jax.data import template
from helpsteer_jax.data.demo import helpsteer3 as demo_helpsteer3
from helpsteer_jax.data.demo import rows as demo_rows
from helpsteer_jax.data.formats import helpsteer
from helpsteer_jax.judges import principle
from helpsteer_jax.runs import principle_demo
from helpsteer_jax.runs import prompts as prompts_lib

from train_utils import task_config

SINGLE, PLAIN, ORDERED = (p.text for p in demo_helpsteer3.PRINCIPLES)


def _words(sentence: str) -> list[str]:
  return [w.strip(string.punctuation).lower() for w in sentence.split()]


def _technical_words() -> set[str]:
  """Words of the technical filler sentences that neither a plain one nor an answer
  uses."""
  plain, technical = set(_words("Here they are: The capital of is plus times")), set()
  for pairs in demo_rows.FILLERS.values():
    for easy, hard in pairs:
      plain.update(_words(easy))
      technical.update(_words(hard))
  return {w for w in technical - plain if w and "{" not in w}


def _well_formed() -> list[re.Pattern]:
  """Every sentence a demo response can hold ungarbled: the three answers' forms and the
  filler sentences, their placeholders any word."""
  forms = [r"\d+ (plus|times) \d+ is -?\d+\.", r"The capital of \w+ is \w+\.",
           r"Here they are: \w+(, \w+)*\."]
  for pairs in demo_rows.FILLERS.values():
    for pair in pairs:
      forms += [re.sub(r"\\\{\w+\\\}", r"\\w+", re.escape(s)) for s in pair]
  return [re.compile(f) for f in forms]


def _sentences(text: str) -> list[str]:
  return [s + "." for s in text.rstrip(".").split(". ")]


def _fulfils(row: dict, technical: set[str], forms: list[re.Pattern]) -> bool:
  """The row's verdict from its response text alone."""
  sentences = _sentences(row["response"])
  if row["principle"] == SINGLE:
    return len(sentences) == 1
  if row["principle"] == PLAIN:
    return not technical & set(_words(row["response"]))
  assert row["principle"] == ORDERED
  words = _words(row["response"])
  return (all(any(f.fullmatch(s) for f in forms) for s in sentences)
          and all(a != b for a, b in zip(words, words[1:])))


def test_the_demo_rows_verdicts_follow_from_their_text(tmp_path):
  out = principle_demo.write_demo(tmp_path / "demo", num_train=120, num_validation=12)
  rows = [json.loads(line) for line in
          gzip.open(out / "principle" / "train.jsonl.gz", "rt", encoding="utf-8")]
  technical, forms = _technical_words(), _well_formed()
  verdicts = {}
  for row in rows:
    assert (row["fulfilment"] == "Yes") == _fulfils(row, technical, forms), row
    verdicts.setdefault(row["principle"], set()).add(row["fulfilment"])
  assert verdicts == {p: {"Yes", "No"} for p in (SINGLE, PLAIN, ORDERED)}
  # what prompts.format=principle reads: every row a judge prompt with its truth
  config = task_config("rl", preset="principle")
  config.prompts.train_path = str(out)
  train = prompts_lib.read_requests("", "train", {}, config)
  assert [r.extra["reference"]["fulfilment"] for r in train] == [
      row["fulfilment"] for row in rows]
  assert all(row["response"] in r.prompt for r, row in zip(train, rows))
  assert len(prompts_lib.read_requests("", "eval", {}, config)) == 12


def test_the_format_examples_answer_the_rl_prompts_with_a_parsed_verdict(tmp_path):
  out = principle_demo.write_demo(tmp_path / "demo", num_train=40, num_validation=8)
  config = task_config("rl", preset="principle")
  config.prompts.train_path = str(out)
  requests = prompts_lib.read_requests("", "train", {}, config)
  examples = helpsteer.read_records(out / principle_demo.FORMAT_EXAMPLES, "train")
  assert len(examples) == len(requests) == 40
  claims = {}
  for p in demo_helpsteer3.PRINCIPLES:
    claims.update({p.yes_claim: True, p.no_claim: False})
  found = set()
  for request, conv in zip(requests, examples):
    answer = conv.turns[-1].text
    claim = answer.split("\n")[0]
    full = template.sft_text(conv)
    # the example is the RL task's own prompt, then the answer and the end of the turn
    assert full.startswith(request.prompt_text())
    assert full[len(request.prompt_text()):].startswith(answer)
    assert principle.parse_judgement(answer) is claims[claim]
    found.add(claims[claim])
  assert found == {True, False}
  assert len(helpsteer.read_records(out / principle_demo.FORMAT_EXAMPLES, "validation")) == 8


def test_the_preset_defaults_to_the_demo():
  config = rl_config.get_config("principle")
  assert config.prompts.train_path == rl_config.PRINCIPLE_DEMO_DATA
  assert config.init.source == rl_config.PRINCIPLE_DEMO_POLICY
  assert config.scorer.source == "principle_verifier"

