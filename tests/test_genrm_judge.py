"""The GenRM judge's text side (judges/genrm.py) against NeMo-Aligner's GenRM verifier.

The reward is re-derived here in NumPy from the reference's rule (sections split on
their markers, the last boxed value in each, -(|s1-h1| + |s2-h2| + |z-rank|), the score
terms only where both labels exist), with this project's stricter parse failures
(-100: a missing box, not exactly two integer scores in 1-5, a ranking not in 1-6).
"""

import numpy as np
import pytest

from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.judges import genrm

BEGIN_S, END_S = "[The Begin of Individual Scores]", "[The End of Individual Scores]"
BEGIN_R, END_R = "[The Begin of Ranking Score]", "[The End of Ranking Score]"


def _answer(scores: str, ranking: str, analysis: str = "Both answer the question.") -> str:
  return (f"{analysis}\n{BEGIN_S}\n\\boxed{{{scores}}}\n{END_S}\n"
          f"{BEGIN_R}\n\\boxed{{{ranking}}}\n{END_R}")


def _reference_reward(text: str, h, rank) -> float:
  """The verifier re-derived: NumPy distances over the boxes the sections hold."""
  def box(section):
    at = section.rfind("\\boxed{")
    if at < 0 or section.rfind("\\boxed") != at:
      return None
    depth, start = 0, at + len("\\boxed")
    for k in range(start, len(section)):
      depth += section[k] == "{"
      depth -= section[k] == "}"
      if depth == 0:
        return section[start + 1:k]
    return None

  def ints(content, count, lo, hi):
    if content is None:
      return None
    items = [c.strip() for c in content.split(",")]
    if len(items) != count or not all(c.lstrip("+-").isdigit() for c in items):
      return None
    values = np.array([int(c) for c in items])
    return values if np.all((values >= lo) & (values <= hi)) else None

  s = ints(box(text.split(BEGIN_S)[-1].split(END_S)[0]), 2, 1, 5)
  z = ints(box(text.split(BEGIN_R)[-1].split(END_R)[0]), 1, 1, 6)
  if s is None or z is None:
    return -100.0
  distance = np.float64(0)
  if None not in h:
    distance += np.abs(s - np.array(h, np.float64)).sum()
  if rank is not None:
    distance += np.abs(z[0] - rank)
  return -float(distance)


CASES = [
    # (answer, h, rank, expected)
    (_answer("4, 2", "2"), [4, 2], 2, 0.0),
    (_answer("5, 1", "1"), [3, 4], 5, -(2 + 3 + 4)),
    (_answer("3,3", "4"), [None, 4], 6, -2.0),          # one label missing: no score terms
    (_answer("3, 3", "4"), [None, None], 3, -1.0),
    (_answer("3, 3", "4"), [2, 5], None, -(1 + 2)),     # no ranking label (a tie)
    (_answer("4, 3.5", "2"), [4, 3], 2, -100.0),        # not an integer
    (_answer("4", "2"), [4, 3], 2, -100.0),             # one score
    (_answer("4, 3, 2", "2"), [4, 3], 2, -100.0),       # three scores
    (_answer("6, 3", "2"), [4, 3], 2, -100.0),          # score out of 1-5
    (_answer("4, 0", "2"), [4, 3], 2, -100.0),
    (_answer("4, 3", "7"), [4, 3], 2, -100.0),          # ranking out of 1-6
    (_answer("4, 3", "0"), [4, 3], 2, -100.0),
    (_answer("4, 3", "two"), [4, 3], 2, -100.0),
    ("I think response 1 is better.", [4, 3], 2, -100.0),  # no box at all
    (f"{BEGIN_S}\n\\boxed{{4, 3}}\n{END_S}", [4, 3], 2, -100.0),  # no ranking box
    ("\\boxed{4, 3}\n\\boxed{2}", [4, 3], 2, -100.0),   # no sections: the last box is both
    # the last box of a section counts (a draft box before it does not)
    (f"{BEGIN_S}\n\\boxed{{1, 1}} no: \\boxed{{4, 3}}\n{END_S}\n{BEGIN_R}\n\\boxed{{2}}\n"
     f"{END_R}", [4, 3], 2, 0.0),
    # a repeated section: the last one counts, as the reference's split does
    (_answer("1, 1", "6") + "\n" + _answer("4, 3", "3"), [4, 3], 2, -1.0),
    (_answer(" +4 ,  3 ", "2"), [4, 3], 2, 0.0),          # whitespace and a sign
    (_answer("4, 3", "2").replace("\\boxed{2}", "\\boxed{2"), [4, 3], 2, -100.0),  # open box
    (_answer("4, 3", "2"), [3.67, 2.0], 2, -(0.33 + 1.0)),  # mean labels as they are given
]


@pytest.mark.parametrize("text,h,rank,expected", CASES)
def test_verifier_reward_matches_the_rederived_reference(text, h, rank, expected):
  reward = genrm.verifier_reward(text, {"scores": h, "ranking": rank})
  np.testing.assert_allclose(reward, _reference_reward(text, h, rank), atol=1e-5)
  np.testing.assert_allclose(reward, expected, atol=1e-5)


def test_parse_reads_each_box_alone():
  assert genrm.parse(_answer("4, 2", "5")) == genrm.Judgement((4, 2), 5)
  assert genrm.parse(_answer("4, 9", "5")) == genrm.Judgement(None, 5)
  assert genrm.parse(_answer("4, 2", "x")) == genrm.Judgement((4, 2), None)
  assert genrm.parse("no boxes") is None
  assert genrm.parse(genrm.answer(genrm.Judgement((2, 5), 6), ["a", "b"])) == (
      genrm.Judgement((2, 5), 6))


def test_bad_references_are_refused():
  for bad in ([4, 3], {"scores": [4]}, {"scores": [4, "3"], "ranking": 2},
              {"scores": [4, 3], "ranking": 7}, {"scores": [4, 3], "ranking": True},
              {"scores": [None, 3], "ranking": None}):
    with pytest.raises(ValueError):
      genrm.verifier_reward(_answer("4, 3", "2"), bad)


def test_label_mapping():
  # overall_preference -3..-1 -> 1..3, 1..3 -> 4..6, ties none
  assert [genrm.ranking_label(p) for p in range(-3, 4)] == [1, 2, 3, None, 4, 5, 6]
  with pytest.raises(ValueError):
    genrm.ranking_label(4)
  # h: the annotators' mean rounded half up
  assert [genrm.helpfulness_label(m) for m in (1.0, 1.33, 2.5, 3.5, 3.67, 4.49, 5.0)] == [
      1, 1, 3, 4, 4, 4, 5]
  assert genrm.helpfulness_label(None) is None
  assert genrm.swapped({"scores": [4, None], "ranking": 2}) == {
      "scores": [None, 4], "ranking": 5}


def test_prompt_holds_the_transcript_responses_and_format():
  context = Conversation(system="Be brief.", turns=(
      Turn("User", "What is 2+2?"), Turn("Assistant", "4.", trainable=False),
      Turn("User", "And 3+3?")))
  text = genrm.prompt(context, ("6.", "Seven."))
  assert "System: Be brief.\n\nUser: What is 2+2?\n\nAssistant: 4.\n\nUser: And 3+3?" in text
  assert "[The Begin of Response 1]\n6.\n[The End of Response 1]" in text
  assert "[The Begin of Response 2]\nSeven.\n[The End of Response 2]" in text
  assert "**Score 1: Not Helpful**" in text and "6 = Response 2 is much better" in text
  assert text.endswith(f"{BEGIN_R}\n\\boxed{{z}}\n{END_R}")
  short = genrm.prompt(context, ("6.", "Seven."), guidelines=False)
  assert "**Score" not in short and "with no tie" in short and len(short) < len(text) / 4
  assert short.endswith(f"{BEGIN_R}\n\\boxed{{z}}\n{END_R}")
  with pytest.raises(ValueError):
    genrm.prompt(context, ("only one",))


def test_aggregation_of_hand_made_judgements():
  J = genrm.Judgement
  pairs = [(0, 1), (1, 0), (0, 2), (2, 0), (1, 2), (2, 1)]
  judgements = [J((5, 2), 1), J((3, 4), 6), None, J((1, 4), 5), J((2, 3), 4),
                J(None, 2)]
  scores = genrm.aggregate(3, pairs, judgements, "mean_score")
  # 0: 5 (0,1), 4 (1,0), 4 (2,0); 1: 2, 3, 2; 2: 1, 3 (the last judgement has no scores)
  np.testing.assert_allclose(scores, [13 / 3, 7 / 3, 2.0], atol=1e-6)
  wins = genrm.aggregate(3, pairs, judgements, "win_count")
  # rankings: (0,1):1 -> 0 wins; (1,0):6 -> 0 wins; (2,0):5 -> 0 wins; (1,2):4 -> 2 wins;
  # (2,1):2 -> 2 wins. 0: 3 of 3; 1: 0 of 4; 2: 2 of 3
  np.testing.assert_allclose(wins, [1.0, 0.0, 2 / 3], atol=1e-6)
  # a group of one judged against itself: both sides are its own
  np.testing.assert_allclose(genrm.aggregate(1, [(0, 0)], [J((4, 2), 2)], "mean_score"), [3.0])
  np.testing.assert_allclose(genrm.aggregate(1, [(0, 0)], [J((4, 2), 2)], "win_count"), [0.5])
  assert np.isnan(genrm.aggregate(2, [(0, 1)], [None], "mean_score")).all()
  with pytest.raises(ValueError):
    genrm.aggregate(1, [], [], "borda")
