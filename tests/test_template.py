"""The SteerLM template: exact strings, loss pieces, labels, HelpSteer2 prompt splitting."""

import pytest

from helpsteer_jax.data.records import ATTRIBUTES, HELPSTEER_ATTRIBUTES, Conversation, Turn
from helpsteer_jax.data.template import (
  DEFAULT_SYSTEM,
  generation_prompt,
  label_string,
  parse_label_string,
  regression_text,
  sft_pieces,
  sft_text,
  split_helpsteer_prompt,
)

HEADER = ("<extra_id_0>System\nA chat between a curious user and an artificial intelligence"
          " assistant. The assistant gives helpful, detailed, and polite answers to the"
          " user's questions.\n")


def one_turn(label="helpfulness:4,verbosity:1"):
  return Conversation(DEFAULT_SYSTEM, (Turn("User", "What is 7 times 8?"),
                                       Turn("Assistant", "56.", label)))


def two_turns(labels=("helpfulness:4,verbosity:1", "helpfulness:3")):
  return Conversation("Be brief.", (
      Turn("User", "What is 7 times 8?"), Turn("Assistant", "56.", labels[0]),
      Turn("User", "And 6 times 9?"), Turn("Assistant", "54, I think.", labels[1])))


def loss_text(conv):
  return "".join(p.text for p in sft_pieces(conv) if p.loss)


def test_default_system_prompt_is_nemo_aligners():
  assert HEADER == f"<extra_id_0>System\n{DEFAULT_SYSTEM}\n"
  assert ATTRIBUTES[4:] == HELPSTEER_ATTRIBUTES == (
      "helpfulness", "correctness", "coherence", "complexity", "verbosity")


def test_single_turn_with_label():
  assert sft_text(one_turn()) == (
      HEADER + "<extra_id_1>User\nWhat is 7 times 8?\n"
      "<extra_id_1>Assistant\n<extra_id_2>helpfulness:4,verbosity:1\n56.\n<extra_id_1>")
  assert loss_text(one_turn()) == "56.\n<extra_id_1>"


def test_single_turn_without_label():
  assert sft_text(one_turn(label=None)) == (
      HEADER + "<extra_id_1>User\nWhat is 7 times 8?\n<extra_id_1>Assistant\n56.\n<extra_id_1>")
  assert loss_text(one_turn(label=None)) == "56.\n<extra_id_1>"


def test_empty_label_string_keeps_its_prefix_like_nemo():
  assert "<extra_id_1>Assistant\n<extra_id_2>\n56.\n" in sft_text(one_turn(label=""))


def test_two_turns_with_labels():
  assert sft_text(two_turns()) == (
      "<extra_id_0>System\nBe brief.\n"
      "<extra_id_1>User\nWhat is 7 times 8?\n"
      "<extra_id_1>Assistant\n<extra_id_2>helpfulness:4,verbosity:1\n56.\n"
      "<extra_id_1>User\nAnd 6 times 9?\n"
      "<extra_id_1>Assistant\n<extra_id_2>helpfulness:3\n54, I think.\n<extra_id_1>")
  # Each response, its "\n" and the <extra_id_1> after it; nothing else.
  assert loss_text(two_turns()) == "56.\n<extra_id_1>54, I think.\n<extra_id_1>"
  assert [p.text for p in sft_pieces(two_turns()) if p.loss] == [
      "56.\n", "<extra_id_1>", "54, I think.\n", "<extra_id_1>"]


def test_two_turns_without_labels():
  conv = two_turns(labels=(None, None))
  assert sft_text(conv) == (
      "<extra_id_0>System\nBe brief.\n<extra_id_1>User\nWhat is 7 times 8?\n"
      "<extra_id_1>Assistant\n56.\n<extra_id_1>User\nAnd 6 times 9?\n"
      "<extra_id_1>Assistant\n54, I think.\n<extra_id_1>")
  assert loss_text(conv) == "56.\n<extra_id_1>54, I think.\n<extra_id_1>"


def test_trailing_turn_start_only_after_a_turn_not_of_the_mask_role():
  ends_with_user = Conversation("S", (Turn("User", "a"), Turn("Assistant", "b"), Turn("User", "c")))
  assert sft_text(ends_with_user).endswith("<extra_id_1>User\nc\n")
  assert loss_text(ends_with_user) == "b\n<extra_id_1>"
  masked_assistant = Conversation("S", (Turn("User", "a"), Turn("Assistant", "b")),
                                  mask_role="Assistant")
  assert sft_text(masked_assistant).endswith("<extra_id_1>Assistant\nb\n")
  assert loss_text(masked_assistant) == ""  # turn 0 never trains; b is masked


def test_first_turn_never_carries_loss_as_in_nemo():
  conv = Conversation("S", (Turn("Assistant", "hi"), Turn("User", "q"), Turn("Assistant", "a")))
  # Turn 0 is context whatever its role; a mask-role turn 1 is masked whole.
  assert loss_text(conv) == "a\n<extra_id_1>"


def test_label_string_order_and_omissions():
  scores = {"verbosity": 2, "helpfulness": 3, "quality": 4, "coherence": 4}
  assert label_string(scores) == "quality:4,helpfulness:3,coherence:4,verbosity:2"
  full = dict(zip(ATTRIBUTES, [4, 0, 1, 2, 3, 4, 4, 2, 1]))
  assert label_string(full) == ("quality:4,toxicity:0,humor:1,creativity:2,helpfulness:3,"
                                "correctness:4,coherence:4,complexity:2,verbosity:1")
  assert label_string({}) == ""


@pytest.mark.parametrize("scores, match", [
    ({"kindness": 3}, "unknown attribute"), ({"helpfulness": 5}, "outside 0..4"),
    ({"helpfulness": True}, "must be an int"), ({"helpfulness": 3.0}, "must be an int")])
def test_label_string_rejects(scores, match):
  with pytest.raises(ValueError, match=match):
    label_string(scores)


@pytest.mark.parametrize("scores", [
    {}, {"helpfulness": 0}, dict(zip(ATTRIBUTES, [4, 0, 1, 2, 3, 4, 4, 2, 1])),
    {"quality": 1, "verbosity": 4}])
def test_parse_round_trip(scores):
  assert parse_label_string(label_string(scores)) == scores
  assert label_string(parse_label_string(label_string(scores))) == label_string(scores)


@pytest.mark.parametrize("label, match", [
    ("helpfulness", "name:score"), ("helpfulness:", "name:score"), (":3", "name:score"),
    ("helpfulness:4,", "name:score"), ("helpfulness=4", "name:score"),
    ("kindness:2", "unknown attribute"), ("helpfulness:x", "not an integer"),
    ("helpfulness:4.0", "not an integer"), ("helpfulness:5", "outside 0..4"),
    ("helpfulness:-1", "outside 0..4"), ("helpfulness:4,helpfulness:3", "twice")])
def test_parse_rejects_malformed(label, match):
  with pytest.raises(ValueError, match=match):
    parse_label_string(label)


def test_generation_prompt():
  attrs = {"helpfulness": 4, "verbosity": 2}
  expected = (HEADER + "<extra_id_1>User\nWhat is 7 times 8?\n"
              "<extra_id_1>Assistant\n<extra_id_2>helpfulness:4,verbosity:2\n")
  prompt_only = Conversation(DEFAULT_SYSTEM, (Turn("User", "What is 7 times 8?"),))
  assert generation_prompt(prompt_only, attrs) == expected
  assert generation_prompt(one_turn(), attrs) == expected  # the response is left out
  # Earlier turns keep their labels, exactly as the model saw them in training.
  assert generation_prompt(two_turns(), {"verbosity": 0}) == (
      "<extra_id_0>System\nBe brief.\n<extra_id_1>User\nWhat is 7 times 8?\n"
      "<extra_id_1>Assistant\n<extra_id_2>helpfulness:4,verbosity:1\n56.\n"
      "<extra_id_1>User\nAnd 6 times 9?\n<extra_id_1>Assistant\n<extra_id_2>verbosity:0\n")
  # The prompt is a prefix of the SFT text of the same conversation.
  same_label = generation_prompt(one_turn(), {"helpfulness": 4, "verbosity": 1})
  assert sft_text(one_turn()).startswith(same_label)


def test_regression_text():
  assert regression_text(one_turn()) == (
      HEADER + "<extra_id_1>User\nWhat is 7 times 8?\n<extra_id_1>Assistant\n56.\n<extra_id_2>")
  assert regression_text(two_turns()) == (
      "<extra_id_0>System\nBe brief.\n<extra_id_1>User\nWhat is 7 times 8?\n"
      "<extra_id_1>Assistant\n56.\n<extra_id_1>User\nAnd 6 times 9?\n"
      "<extra_id_1>Assistant\n54, I think.\n<extra_id_2>")
  with pytest.raises(ValueError, match="last turn"):
    regression_text(Conversation("S", (Turn("User", "q"),)))


def test_split_helpsteer_prompt_three_user_turns():
  prompt = ("Hi there\n<extra_id_1>Assistant\nHello! How can I help?\n<extra_id_1>User\n"
            "Name a fruit.\n<extra_id_1>Assistant\nApple.\n\nAnother one?\n"
            "<extra_id_1>User\nOne more, please.")
  assert split_helpsteer_prompt(prompt) == [
      Turn("User", "Hi there"), Turn("Assistant", "Hello! How can I help?", trainable=False),
      Turn("User", "Name a fruit."), Turn("Assistant", "Apple.\n\nAnother one?", trainable=False),
      Turn("User", "One more, please.")]
  assert split_helpsteer_prompt("Just one turn.\nTwo lines.") == [
      Turn("User", "Just one turn.\nTwo lines.")]


def test_split_prompt_templates_to_the_same_text_as_nemo_unsplit():
  """NeMo's HelpSteer2 preprocessing keeps the whole prompt in one User turn."""
  prompt = "u1\n<extra_id_1>Assistant\na1\n<extra_id_1>User\nu2"
  response = Turn("Assistant", "a2", "helpfulness:2")
  split = Conversation(DEFAULT_SYSTEM, (*split_helpsteer_prompt(prompt), response))
  unsplit = Conversation(DEFAULT_SYSTEM, (Turn("User", prompt), response))
  assert sft_text(split) == sft_text(unsplit)
  assert regression_text(split) == regression_text(unsplit)


def test_helpsteer_context_turns_carry_no_loss():
  """HelpSteer2 prompts are context (NeMo keeps them in one user turn): only the
  scored response trains."""
  prompt = "Hi\n<extra_id_1>Assistant\nHello!\n<extra_id_1>User\nName a fruit."
  conv = Conversation(DEFAULT_SYSTEM, tuple(split_helpsteer_prompt(prompt))
                      + (Turn("Assistant", "Pear.", "helpfulness:4"),))
  trained = "".join(p.text for p in sft_pieces(conv) if p.loss)
  assert trained == "Pear.\n<extra_id_1>"
