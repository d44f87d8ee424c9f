"""RLBFF's principle judge as text and NumPy (`judges.principle`): the training reward
re-derived here after NeMo-RL's `PrincipleGenrmVerifyWorker.calculate_rewards` on
hand-made top-20 log-prob arrays (the truth's sign, a token missing from the top k, no
judgement), the verdict parser, the verdict token's position in an answer, and the
prompt rows of HelpSteer3 principle rows written here in the card's schema."""

import gzip
import json
import math

import numpy as np
import pytest

from helpsteer_jax.data.demo.tokenizer import build_demo_tokenizer
from helpsteer_jax.data.formats import helpsteer3
from helpsteer_jax.judges import principle

K = 20
YES_ID, NO_ID = 7, 9
TOKENS = principle.VerdictTokens((), YES_ID, NO_ID)


def _top(rng, present: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
  """A position's top-20 (ids, log-probs), most likely first, holding `present`."""
  others = [i for i in range(100, 200) if i not in present]
  ids = list(present) + list(rng.choice(others, K - len(present), replace=False))
  logp = list(present.values()) + list(rng.uniform(-12.0, -6.0, K - len(present)))
  order = np.argsort(-np.asarray(logp), kind="stable")
  return np.asarray(ids)[order], np.asarray(logp, np.float32)[order]


def _reference_reward(top_ids, top, has_judgement: bool, truth: str) -> float:
  """NeMo-RL's rule, written out: -inf for a token outside the top 20; -50 when either
  is -inf (here also without a judgement); else log p(correct) - log p(incorrect)."""
  yes = no = -math.inf
  if has_judgement:
    for token, value in zip(top_ids.tolist(), top.tolist()):
      if token == YES_ID:
        yes = max(yes, value)
      if token == NO_ID:
        no = max(no, value)
  if yes == -math.inf or no == -math.inf:
    return -50.0
  return yes - no if truth == "Yes" else no - yes


CASES = [  # (present tokens and log-probs, an answer with a judgement, truth)
    ({YES_ID: -0.1, NO_ID: -2.5}, True, "Yes"),
    ({YES_ID: -0.1, NO_ID: -2.5}, True, "No"),
    ({NO_ID: -0.01, YES_ID: -4.75}, True, "No"),
    ({YES_ID: -0.7, NO_ID: -0.7}, True, "Yes"),         # a tie: 0
    ({YES_ID: -0.001}, True, "Yes"),                    # " No" outside the top 20
    ({NO_ID: -0.2}, True, "Yes"),                       # " Yes" outside
    ({}, True, "No"),                                   # neither
    ({YES_ID: -0.3, NO_ID: -1.2}, False, "Yes"),        # no judgement in the answer
]


def test_the_training_reward_is_nemo_rls():
  rng = np.random.default_rng(0)
  yes, no, fulfilled, expected = [], [], [], []
  for present, judged, truth in CASES:
    top_ids, top = _top(rng, present)
    y, n = principle.verdict_logprobs(top_ids, top, TOKENS) if judged else (math.nan,) * 2
    yes.append(y)
    no.append(n)
    fulfilled.append(truth == "Yes")
    expected.append(_reference_reward(top_ids, top, judged, truth))
  got = principle.training_reward(yes, no, fulfilled)
  np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
  assert got[0] > 0 > got[1] and got[3] == 0.0
  assert list(got[4:]) == [principle.PENALTY] * 4
  assert list(principle.training_reward(yes[4:], no[4:], fulfilled[4:], penalty=-3.0)) == [-3.0] * 4


def test_verdict_log_probs_read_the_top_alternatives():
  top_ids = np.asarray([3, NO_ID, 5, YES_ID])
  top = np.asarray([-0.5, -1.0, -2.0, -3.0])
  assert principle.verdict_logprobs(top_ids, top, TOKENS) == (-3.0, -1.0)
  assert principle.verdict_logprobs(top_ids[:2], top[:2], TOKENS) == (-math.inf, -1.0)


@pytest.mark.parametrize("text, verdict", [
    ("It rhymes.\nFinal Judgement: Yes", True),
    ("Final Judgement: No", False),
    ("Final Judgement:\tNo.", False),
    ("First Final Judgement: Yes, on reflection Final Judgement: No", False),
    ("Final Judgement: Yesterday", None),
    ("final judgement: yes", None),
    ("It does fulfil it.", None),
    ("", None)])
def test_the_parser_reads_the_last_judgement(text, verdict):
  assert principle.parse_judgement(text) is verdict
  offset = principle.judgement_offset(text)
  assert (offset is None) == (verdict is None)
  if offset is not None:
    assert text[:offset].endswith(principle.JUDGEMENT)


def test_the_verdict_position_with_single_token_verdicts():
  """Word-level tokens, " Yes" one of them: the position is the token that writes it."""
  vocab = ["Because", " it", " rhymes", ".", "\n", "Final", " Judgement", ":", " Yes",
           " No", "</s>"]
  decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
  tokens = principle.verdict_tokens(lambda s: [vocab.index(s)])
  assert (tokens.prefix, tokens.yes, tokens.no) == ((), 8, 9)
  ids = [0, 1, 2, 3, 4, 5, 6, 7, 8, 10]
  assert principle.judgement_position(ids, decode, tokens) == 8
  assert principle.judgement_position([0, 1, 2, 3, 10], decode, tokens) is None
  two = [5, 6, 7, 9, 4, 5, 6, 7, 8]  # the last judgement counts
  assert principle.judgement_position(two, decode, tokens) == 8


def test_the_verdict_position_with_a_byte_level_tokenizer(tmp_path):
  """The demo tokenizer writes " Yes" as " " "Y" "es": the shared " " is the prefix and
  "Y" / "N" are read where they differ."""
  import transformers
  tok = transformers.AutoTokenizer.from_pretrained(str(build_demo_tokenizer(tmp_path / "t")))
  encode = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
  decode = lambda ids: tok.decode(list(ids), skip_special_tokens=False)  # noqa: E731
  tokens = principle.verdict_tokens(encode)
  assert decode(tokens.prefix) == " " and decode([tokens.yes]) == "Y"
  assert decode([tokens.no]) == "N"
  ids = encode("The response is short.\nFinal Judgement: No") + [tok.eos_token_id]
  pos = principle.judgement_position(ids, decode, tokens)
  assert ids[pos] == tokens.no and decode(ids[:pos]).endswith("Final Judgement: ")


CONTEXT = [{"role": "system", "content": "Be brief."},
           {"role": "user", "content": "Write a haiku about rain."},
           {"role": "assistant", "content": "Rain taps the window..."},
           {"role": "user", "content": "Now one about snow."}]


def test_prompt_rows_from_helpsteer3_principle_rows(tmp_path):
  rows = [{"domain": "general", "language": "english", "context": CONTEXT,
           "response": "Snow falls soft.", "principle": "The response is a haiku.",
           "fulfilment": "Yes"},
          {"domain": "code", "language": "python", "context": CONTEXT[1:2],
           "response": "x = 1", "principle": "The code is commented.", "fulfilment": "No"}]
  path = tmp_path / "principle" / "train.jsonl.gz"
  path.parent.mkdir()
  with gzip.open(path, "wt") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  records = helpsteer3.read_helpsteer3(tmp_path, "principle")
  first, second = (principle.prompt_row(r) for r in records)
  assert first["reference"] == {"fulfilment": "Yes", "principle": "The response is a haiku.",
                                "source": f"{path}:1"}
  assert second["reference"]["fulfilment"] == "No" and second["domain"] == "code"
  prompt = first["prompt"]
  assert ("[Conversation]\nSystem: Be brief.\n\nUser: Write a haiku about rain.\n\n"
          "Assistant: Rain taps the window...\n\nUser: Now one about snow.\n\n"
          "[Response]\nSnow falls soft.\n\n[Principle]\nThe response is a haiku.") in prompt
  assert prompt.endswith('"Final Judgement: Yes" if it does or "Final Judgement: No" if'
                         " it does not.")
  assert principle.truth(first["reference"]) and not principle.truth(second["reference"])
  with pytest.raises(ValueError, match="x.jsonl:3.*fulfilment"):
    principle.truth({"principle": "p"}, "x.jsonl:3")
