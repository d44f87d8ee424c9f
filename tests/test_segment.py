"""The sentence segmenter and the segment -> token mapping on real tokenizers."""

import numpy as np
import pytest

from helpsteer_jax.data import segment
from helpsteer_jax.data.demo import pairs_2d as demo_2d
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.features import pair_rows
from helpsteer_jax.data.formats import helpsteer_2d as pairs
from helpsteer_jax.models import hf


@pytest.mark.parametrize("text, expected", [
    ("Hello there. This is 2.5 times e.g. better! Really? Yes.",
     ["Hello there. ", "This is 2.5 times e.g. better! ", "Really? ", "Yes."]),
    ("Steps:\n1. Do this.\n2. Do that. And more.\n- bullet one\n* bullet two\n\nDone.",
     ["Steps:\n", "1. Do this.\n", "2. Do that. ", "And more.\n", "- bullet one\n",
      "* bullet two\n\n", "Done."]),
    ("Code:\n```python\nx = 1.5\nprint(x). y\n\n```\nAfter code. End",
     ["Code:\n", "```python\nx = 1.5\nprint(x). y\n\n```\n", "After code. ", "End"]),
    ("数字。好的！ Mixed text. 中文句子？对",
     ["数字。", "好的！ ", "Mixed text. ", "中文句子？", "对"]),
    ("Dr. Smith met J. Doe at 5 p.m. today. Then he left...  Bye",
     ["Dr. Smith met J. Doe at 5 p.m. today. ", "Then he left...  ", "Bye"]),
    ('He said "stop." Then a) went on. It costs $3.50, i.e. cheap.',
     ['He said "stop." ', "Then a) went on. ", "It costs $3.50, i.e. cheap."]),
    ("Unclosed\n```\ncode. more\n", ["Unclosed\n", "```\ncode. more\n"]),
    ("   lead. trail   ", ["   lead. ", "trail   "]),
    ("", []),
])
def test_split_sentences(text, expected):
  assert segment.segment_texts(text) == expected
  assert "".join(segment.segment_texts(text)) == text


def test_segments_tile_random_demo_text():
  for row in demo_2d.demo_pairs(50, seed=3):
    for side in ("chosen", "rejected"):
      assert segment.segment_texts(row[side]) == [s["text"] for s in row[f"{side}_segments"]]


def test_spans_of_requires_exact_tiling():
  assert segment.spans_of("ab cd", ["ab ", "cd"]) == [(0, 3), (3, 5)]
  assert segment.spans_of("ab cd", ["ab", "cd"]) is None
  assert segment.spans_of("ab", ["ab", ""]) is None


def _pair(prompt, chosen, rejected, aspects=1):
  def resp(text):
    segs = tuple(segment.segment_texts(text))
    return pairs.ScoredResponse(text, segs, np.full((len(segs), aspects), 2.0, np.float32))
  return pairs.ScoredPair(prompt, resp(chosen), resp(rejected))


@pytest.fixture(scope="module", params=["sentencepiece", "demo_bpe"])
def tokenizer(request, sentencepiece_dir, tmp_path_factory):
  if request.param == "sentencepiece":
    return hf.load_tokenizer(sentencepiece_dir)
  return hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path_factory.mktemp("demo_tok")))


def test_segment_token_spans_cover_each_segment(tokenizer):
  chosen = "First one. Then 2.5 more!\n1. An item\n数字。好的"
  rejected = "No."
  pair = _pair("Say it.\n<extra_id_1>Assistant\nOk.\n<extra_id_1>User\nAgain?", chosen, rejected)
  (f,), report = pair_rows.pair_features([pair], tokenizer, seq_len=160, max_segments=8,
                                          score_max=4.0)
  assert report.kept == 1
  pieces, offset = pair_rows.response_pieces(pair.prompt, chosen)
  text = "".join(p.text for p in pieces)
  example = pair_rows.tokenize.tokenize_pieces(pieces, tokenizer)
  spans = example.char_spans[1:][: int((f["segment_ids"][0] > 0).sum())]  # the targets
  segs = f["token_segments"][0][: len(spans)]
  chosen_segments = pair.chosen.segments
  assert sorted(set(segs[segs > 0].tolist())) == list(range(1, len(chosen_segments) + 1))
  for k, seg_text in enumerate(chosen_segments, 1):
    idx = np.flatnonzero(segs == k)
    assert np.all(np.diff(idx) == 1), "a segment's tokens are contiguous"
    covered = text[spans[idx, 0].min():spans[idx, 1].max()]  # byte tokens share characters
    if k < len(chosen_segments):
      assert covered.strip() == seg_text.strip(), (k, covered, seg_text)
    else:  # the last segment also owns the end-of-turn marker
      assert covered.startswith(seg_text.strip()) or covered.strip().startswith(seg_text.strip())
      assert covered.rstrip().endswith("<extra_id_1>")
  # Prompt tokens (including the earlier assistant turn) carry no segment.
  first = int(np.flatnonzero(segs)[0])
  assert spans[first][1] > offset and spans[first - 1][0] < offset
  assert f["lengths"][0] == (segs > 0).sum()
  np.testing.assert_array_equal(f["seg_mask"][0, :len(chosen_segments)], 1.0)
  np.testing.assert_array_equal(f["seg_mask"][0, len(chosen_segments):], 0.0)


def test_long_prompt_is_truncated_left_and_segments_survive(tokenizer):
  pair = _pair("word " * 300 + "end?", "Short answer. Second part.", "Bad.")
  (f,), report = pair_rows.pair_features([pair], tokenizer, seq_len=64, max_segments=4,
                                          score_max=4.0)
  assert report.truncated == 1
  assert set(np.unique(f["token_segments"][0]).tolist()) == {0, 1, 2}
  too_long = _pair("q", "x " * 200, "y")
  features, report = pair_rows.pair_features([too_long], tokenizer, seq_len=64, max_segments=4,
                                              score_max=4.0)
  assert features == [] and report.dropped["too_long"] == 1
  features, report = pair_rows.pair_features([_pair("q", "One. Two. Three. Four. Five.", "y")],
                                              tokenizer, seq_len=64, max_segments=4, score_max=4.0)
  assert features == [] and report.dropped["too_many_segments"] == 1
