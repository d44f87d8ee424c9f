"""Annotation: labels on every assistant turn, and resuming without duplicates or loss."""

import json

import numpy as np
import pytest

from helpsteer_jax.data.formats import helpsteer as readers
from helpsteer_jax.data.records import ATTRIBUTES, Conversation, Turn
from helpsteer_jax.data.template import parse_label_string
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.tasks import annotate


class FakeScorer:
  """Predictions that depend only on the sequence (so reruns agree)."""

  def __init__(self, fail_after=None):
    self.calls, self.fail_after = 0, fail_after

  def score(self, seqs, on_batch=None):
    self.calls += 1
    if self.fail_after is not None and self.calls > self.fail_after:
      raise KeyboardInterrupt("killed")
    out = np.asarray([[(len(s) + j) % 7 - 1.2 for j in range(len(ATTRIBUTES))] for s in seqs],
                     np.float32).reshape(len(seqs), len(ATTRIBUTES))
    if on_batch:
      on_batch(len(seqs))
    return out


class IdTok:
  def ids(self, conv):
    return np.arange(sum(len(t.text) for t in conv.turns))


class FakeModelScorer:
  """A `Scorer` as the attribute model's: conversations -> ids -> the fake model."""

  def __init__(self, scorer):
    self.scorer, self.local_rows = scorer, 0

  def __call__(self, convs):
    self.local_rows += len(convs)
    return self.scorer.score([IdTok().ids(c) for c in convs])


def rm(scorer):
  """A fake attribute model behind the `Scorer` annotate uses."""
  return FakeModelScorer(scorer)


def convs(n):
  out = []
  for i in range(n):
    turns = [Turn("User", f"question {i}"), Turn("Assistant", "a" * (i + 1), "helpfulness:1")]
    if i % 3 == 0:
      turns += [Turn("User", "and?"), Turn("Assistant", "b" * (2 * i + 1))]
    out.append(Conversation("S", tuple(turns), source=f"in:{i + 1}"))
  return out


def read_rows(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_assistant_turn_gets_clipped_rounded_labels(tmp_path):
  out = tmp_path / "out.jsonl"
  counts = annotate.annotate(convs(4), rm(FakeScorer()), out, chunk_rows=3,
                             slots=range(len(ATTRIBUTES)))
  assert counts["written"] == 4 and counts["turns"] == 6
  rows = read_rows(out)
  for row in rows:
    assert row["type"] == "VALUE_TO_TEXT" and row["mask"] == "User"
    for turn in row["conversations"]:
      if turn["from"] == "User":
        assert turn["label"] is None
      else:
        scores = parse_label_string(turn["label"])
        assert list(scores) == list(ATTRIBUTES)
        assert all(0 <= v <= 4 for v in scores.values())
  # The second turn of row 0 was scored on the whole conversation up to it.
  length = len("question 0") + 1 + len("and?") + 1
  want = {a: int(min(max(round((length + j) % 7 - 1.2), 0), 4)) for j, a in enumerate(ATTRIBUTES)}
  assert parse_label_string(rows[0]["conversations"][3]["label"]) == want
  # The output reads back as SteerLM conversations.
  assert len(readers.read_steerlm_conversations(out)) == 4


def test_resume_after_a_kill_neither_duplicates_nor_loses_rows(tmp_path):
  data = convs(11)
  full = tmp_path / "full.jsonl"
  annotate.annotate(data, rm(FakeScorer()), full, chunk_rows=3, slots=[4, 8])
  part = tmp_path / "part.jsonl"
  with pytest.raises(KeyboardInterrupt):
    annotate.annotate(data, rm(FakeScorer(fail_after=2)), part, chunk_rows=3, slots=[4, 8])
  assert len(read_rows(part)) == 6
  with open(part, "a") as f:  # a torn write from the killed run
    f.write('{"system": "S", "conv')
  counts = annotate.annotate(data, rm(FakeScorer()), part, chunk_rows=3, slots=[4, 8])
  assert counts["already_written"] == 6 and counts["written"] == 5
  assert part.read_text() == full.read_text()
  again = annotate.annotate(data, rm(FakeScorer()), part, chunk_rows=3, slots=[4, 8])
  assert again["written"] == 0 and part.read_text() == full.read_text()


def test_resume_refuses_an_output_of_another_input(tmp_path):
  out = tmp_path / "out.jsonl"
  annotate.annotate(convs(4), rm(FakeScorer()), out, chunk_rows=2, slots=[4])
  other = [Conversation("S", (Turn("User", "x"), Turn("Assistant", "y")))] * 5
  with pytest.raises(ConfigError, match="another input"):
    annotate.annotate(other, rm(FakeScorer()), out, chunk_rows=2, slots=[4])
  with pytest.raises(ConfigError, match="another input"):
    annotate.annotate(convs(3), rm(FakeScorer()), out, chunk_rows=2, slots=[4])


def test_attribute_selection():
  assert annotate.attribute_selection("") == list(range(9))
  assert annotate.attribute_selection("helpfulness, verbosity") == [4, 8]
  with pytest.raises(ConfigError, match="unknown"):
    annotate.attribute_selection("kindness")
