"""Tokenized SteerLM examples: loss mask token by token on a real SentencePiece model."""

import dataclasses
import pathlib
import shutil

import numpy as np
import pytest

from helpsteer_jax.data.features.tokenize import TokenizedExample, tokenize_pieces, truncate
from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.data.template import Piece, sft_pieces, sft_text
from helpsteer_jax.errors import ConfigError

CONV = Conversation("A chat.", (
    Turn("User", "What is 7 times 8?"), Turn("Assistant", "56.", "helpfulness:4,verbosity:1"),
    Turn("User", " Thanks"), Turn("Assistant", " You are welcome.", "helpfulness:4")))

# How the Llama-2 SentencePiece model splits the markers (no special tokens).
MARK = ["<", "extra", "_", "id", "_"]
NL = "<0x0A>"


def _expected_pairs():
  def group(tokens, loss):
    return [(t, loss) for t in tokens]
  return (group(["<s>", "▁<", *MARK[1:], "0", ">", "System", NL, "A", "▁chat", ".", NL,
                 *MARK, "1", ">", "User", NL, "What", "▁is", "▁", "7", "▁times", "▁", "8",
                 "?", NL, *MARK, "1", ">", "Ass", "istant", NL, *MARK, "2", ">", "help",
                 "fulness", ":", "4", ",", "verb", "osity", ":", "1", NL], False)
          + group(["5", "6", ".", NL, *MARK, "1", ">"], True)
          + group(["User", NL, "▁Thanks", NL, *MARK, "1", ">", "Ass", "istant", NL, *MARK,
                   "2", ">", "help", "fulness", ":", "4", NL], False)
          + group(["▁You", "▁are", "▁welcome", ".", NL, *MARK, "1", ">"], True))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  mistral_common = pytest.importorskip("mistral_common")
  transformers = pytest.importorskip("transformers")
  src = pathlib.Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
  out = tmp_path_factory.mktemp("sp")
  shutil.copy(src, out / "tokenizer.model")
  return transformers.LlamaTokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def example(tok):
  return tokenize_pieces(sft_pieces(CONV), tok, source="conv:1")


def test_loss_mask_token_by_token(tok, example):
  pairs = list(zip(tok.convert_ids_to_tokens(example.ids.tolist()), example.loss_mask.tolist()))
  assert pairs == _expected_pairs()
  assert example.ids.dtype == np.int32 and example.loss_mask.dtype == bool
  assert example.source == "conv:1"


def test_loss_tokens_are_exactly_the_responses_and_end_markers(tok, example):
  assert tok.decode(example.ids[example.loss_mask]) == (
      "56.\n<extra_id_1> You are welcome.\n<extra_id_1>")
  edges = np.diff(np.concatenate([[0], example.loss_mask.astype(int), [0]]))
  starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
  assert [tok.decode(example.ids[a:b]) for a, b in zip(starts, ends)] == [
      "56.\n<extra_id_1>", "You are welcome.\n<extra_id_1>"]  # decode drops the lead space


def test_whole_string_is_tokenized_once(tok, example):
  text = sft_text(CONV)
  assert example.ids[1:].tolist() == tok(text, add_special_tokens=False).input_ids
  piecewise = sum((tok(p.text, add_special_tokens=False).input_ids
                   for p in sft_pieces(CONV)), [])
  assert piecewise != example.ids[1:].tolist()  # SentencePiece's dummy prefix per call


def test_bos_handling(tok, example):
  assert example.has_bos and example.ids[0] == tok.bos_token_id == 1
  assert not example.loss_mask[0]
  no_bos = tokenize_pieces(sft_pieces(CONV), tok, add_bos=False)
  assert not no_bos.has_bos
  assert no_bos.ids.tolist() == example.ids[1:].tolist()
  assert no_bos.loss_mask.tolist() == example.loss_mask[1:].tolist()

  class NoBos:
    bos_token_id = None

    def __call__(self, *args, **kwargs):
      return tok(*args, **kwargs)

  assert tokenize_pieces(sft_pieces(CONV), NoBos()).ids.tolist() == no_bos.ids.tolist()


class CharPairs:
  """A stub tokenizer: one token per two characters, to test the boundary rule."""
  bos_token_id = 99

  def __call__(self, text, add_special_tokens, return_offsets_mapping):
    assert not add_special_tokens and return_offsets_mapping
    offsets = [(i, min(i + 2, len(text))) for i in range(0, len(text), 2)]
    return {"input_ids": [ord(text[a]) for a, _ in offsets], "offset_mapping": offsets}


def test_a_token_takes_the_flag_of_the_piece_its_first_character_is_in():
  pieces = [Piece("a", False), Piece("bc", True), Piece("", True), Piece("de", False)]
  ex = tokenize_pieces(pieces, CharPairs(), add_bos=False)
  # Tokens "ab", "cd", "e": "ab" starts in piece 0, "cd" in piece 1, "e" in piece 3.
  assert ex.loss_mask.tolist() == [False, True, False]


def test_protected_start_is_the_last_response_header(tok, example):
  tail = tok.decode(example.ids[example.protected_start:])
  assert tail == "<extra_id_1>Assistant\n<extra_id_2>helpfulness:4\n You are welcome.\n<extra_id_1>"


def test_truncate_fits_and_drop(example):
  n = len(example.ids)
  assert truncate(example, n, "drop") is example
  assert truncate(example, n, "truncate_left") is example
  assert truncate(example, n - 1, "drop") is None


def test_truncate_left_keeps_bos_and_the_last_response(tok, example):
  n = len(example.ids)
  keep = n - example.protected_start
  for max_length in (n - 1, keep + 5, keep + 1):
    out = truncate(example, max_length, "truncate_left")
    assert len(out.ids) == len(out.loss_mask) == max_length
    assert out.ids[0] == tok.bos_token_id and out.has_bos
    assert out.ids[1:].tolist() == example.ids[n - max_length + 1:].tolist()
    assert not out.loss_mask[1]  # its context is gone
    header = tok.decode(out.ids[out.protected_start:])
    assert header.startswith("<extra_id_1>Assistant\n<extra_id_2>")
    assert tok.decode(out.ids).endswith(" You are welcome.\n<extra_id_1>")
  # The response, its label and the BOS need keep + 1 tokens.
  assert truncate(example, keep, "truncate_left") is None
  assert truncate(example, 10, "truncate_left") is None


def test_truncate_left_without_bos_or_protected_start():
  ids = np.arange(10, dtype=np.int32)
  mask = np.array([0, 0, 1, 1, 0, 0, 0, 1, 1, 1], bool)
  ex = TokenizedExample(ids, mask)  # last run of targets starts at 7
  out = truncate(ex, 4, "truncate_left")
  assert out.ids.tolist() == [6, 7, 8, 9] and out.loss_mask.tolist() == [False, True, True, True]
  assert truncate(ex, 3, "truncate_left").ids.tolist() == [7, 8, 9]
  assert truncate(ex, 2, "truncate_left") is None
  with_bos = dataclasses.replace(ex, has_bos=True)
  assert truncate(with_bos, 4, "truncate_left").ids.tolist() == [0, 7, 8, 9]


def test_truncate_rejects_unknown_policy(example):
  with pytest.raises(ConfigError, match="truncation policy"):
    truncate(example, 8, "truncate_right")
