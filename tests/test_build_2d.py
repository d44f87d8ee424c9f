"""Building HelpSteer-2D data through the scoring interface (with a test double)."""

import json

import numpy as np
import pytest

from helpsteer_jax.data import segment
from helpsteer_jax.data.formats import helpsteer_2d as pairs
from helpsteer_jax.data.formats.helpsteer import helpsteer_conversation
from helpsteer_jax.data.records import HELPSTEER_ATTRIBUTES
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.scoring import segments as segment_scores
from helpsteer_jax.scoring.scorer import HostScorer

import fake_scorer
from conftest import REPO_ROOT


def load_config(name, preset=""):
  import runpy
  return runpy.run_path(str(REPO_ROOT / "configs" / f"{name}.py"))["get_config"](preset)


PLAIN = [pairs.PlainPair("What is 2 plus 2?", "2 plus 2 is 4. Count on by two. Done.",
                         "2 plus 2 is 5.\n- wrong item"),
         pairs.PlainPair("Hi.\n<extra_id_1>Assistant\nHello.\n<extra_id_1>User\nName three colors.",
                         "Here they are: red, blue, green.", "I like trains. red.")]


def _expected(prompt, text, mode):
  spans = segment.split_sentences(text)
  prefixes = [""] + [text[:b].rstrip() for _, b in spans]
  f = np.stack([fake_scorer.fake_attributes(c)[4:] for c in
                (helpsteer_conversation(prompt, p, {}) for p in prefixes)])
  seg = f[1:] if mode == "in_context" else 2.0 + np.diff(f, axis=0)
  return np.clip(seg, 0, 4)


@pytest.mark.parametrize("mode", segment_scores.MODES)
def test_segment_scores_follow_the_chosen_mode(mode):
  scorer = fake_scorer.make(None)
  built = segment_scores.score_pairs(PLAIN, HostScorer(scorer), mode, chunk=3)
  assert sum(scorer.calls) == sum(len(segment.split_sentences(t)) + 1
                                  for p in PLAIN for t in (p.chosen, p.rejected))
  assert max(scorer.calls) <= 3
  for plain, pair in zip(PLAIN, built):
    for side in ("chosen", "rejected"):
      resp = getattr(pair, side)
      assert "".join(resp.segments) == getattr(plain, side)
      np.testing.assert_allclose(resp.scores, _expected(plain.prompt, resp.text, mode), atol=1e-6)


def test_the_prefix_texts_are_the_attribute_models_input():
  texts = segment_scores.prefix_texts("Q?", "A. B.", [(0, 3), (3, 5)])
  assert texts[0].endswith("<extra_id_1>Assistant\n\n<extra_id_2>")
  assert texts[1].endswith("<extra_id_1>Assistant\nA.\n<extra_id_2>")
  assert texts[2].endswith("<extra_id_1>Assistant\nA. B.\n<extra_id_2>")


def test_task_writes_valid_helpsteer_2d(tmp_path, helpsteer2_sample):
  from helpsteer_jax.tasks import build_2d as task
  config = load_config("build_2d")
  config.scorer.source = "fake_scorer:make"
  config.data.input_path = str(helpsteer2_sample)
  config.data.max_pairs = 3
  summary = task.run(config, str(tmp_path))
  got = pairs.read_2d(summary["output"], HELPSTEER_ATTRIBUTES)
  assert len(got) == 3 and summary["pairs"] == 3
  rows = [json.loads(line) for line in helpsteer2_sample.read_text().splitlines()]
  helpfulness = {r["response"]: r["helpfulness"] for r in rows}
  for p in got:
    assert helpfulness[p.chosen.text] > helpfulness[p.rejected.text]
    assert np.all((p.chosen.scores >= 0) & (p.chosen.scores <= 4))


def test_task_needs_a_scorer(tmp_path):
  from helpsteer_jax.tasks import build_2d as task
  config = load_config("build_2d")
  config.scorer.source = ""
  with pytest.raises(ConfigError, match="scorer.source is empty"):
    task.run(config, str(tmp_path))
  config.scorer.source = "fake_scorer:nope"
  with pytest.raises(ConfigError, match="cannot be loaded"):
    task.run(config, str(tmp_path))
  config.scorer.source = str(tmp_path / "no_such_run")
  with pytest.raises(ConfigError, match="no such file or directory, URL"):
    task.run(config, str(tmp_path))
  with pytest.raises(ConfigError, match="returned shape"):
    segment_scores.score_pairs(PLAIN, HostScorer(lambda convs: np.zeros((len(convs), 5))))


def test_pairs_with_an_unscored_segment_are_left_out():
  def scorer(convs):  # NaN (too long for the model) for one prefix of the second pair
    out = np.stack([fake_scorer.fake_attributes(c) for c in convs])
    out[["I like trains. red." in c.turns[-1].text for c in convs]] = np.nan
    return out

  built = segment_scores.score_pairs(PLAIN, HostScorer(scorer))
  assert [p.prompt for p in built] == [PLAIN[0].prompt]
