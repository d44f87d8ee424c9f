"""Tokenizer loading on the real Llama-2-style SentencePiece model of mistral-common."""

import os
import pathlib
import subprocess
import sys

import pytest

from helpsteer_jax.models import hf

SAMPLE = ("<extra_id_0>System\nA chat between a curious user and an assistant.\n"
          "<extra_id_1>User\nWhat is 7 times 8? Ünïcödé, 数字, emoji 🙂\n"
          "<extra_id_1>Assistant\n<extra_id_2>helpfulness:4,verbosity:1\n56.\n<extra_id_1>")


@pytest.fixture(scope="module")
def sp_dir(sentencepiece_dir) -> pathlib.Path:
  return sentencepiece_dir


def test_matches_sentencepiece_itself(sp_dir):
  """Reference: the `sentencepiece` library encoding the same model file."""
  import sentencepiece
  sp = sentencepiece.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
  tok = hf.load_tokenizer(sp_dir)
  assert len(tok) == 32000
  ids = tok(SAMPLE, add_special_tokens=False).input_ids
  assert ids == sp.encode(SAMPLE)
  assert tok.decode(ids) == SAMPLE


def test_offsets_cover_the_text(sp_dir):
  tok = hf.load_tokenizer(sp_dir)
  enc = tok(SAMPLE, add_special_tokens=False, return_offsets_mapping=True)
  offsets = enc.offset_mapping
  assert len(offsets) == len(enc.input_ids)
  assert all(a <= b for a, b in offsets)
  assert all(offsets[i][0] >= offsets[i - 1][0] for i in range(1, len(offsets)))
  assert offsets[-1][1] == len(SAMPLE)


def test_saved_and_reloaded_tokenizer_is_identical(sp_dir, tmp_path):
  tok = hf.load_tokenizer(sp_dir)
  tok.save_pretrained(tmp_path / "saved")
  again = hf.load_tokenizer(tmp_path / "saved")
  assert again(SAMPLE).input_ids == tok(SAMPLE).input_ids
  assert again.bos_token_id == tok.bos_token_id == 1
  assert again.eos_token_id == tok.eos_token_id == 2


def test_directory_without_tokenizer_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="No tokenizer files"):
    hf.load_tokenizer(tmp_path)


def test_an_export_loads_as_auto_tokenizer_loads_it_without_pytorch(tmp_path):
  """Reference: transformers' AutoTokenizer on the same directory. A training process
  (tokenizer and TensorBoard writer) imports no PyTorch, even where it is installed."""
  import transformers

  from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
  tok_dir = demo_tokenizer.build_demo_tokenizer(tmp_path / "tok")
  ours, auto = hf.load_tokenizer(tok_dir), transformers.AutoTokenizer.from_pretrained(tok_dir)
  assert type(ours) is type(auto)
  assert ours(SAMPLE).input_ids == auto(SAMPLE).input_ids
  assert ours.all_special_tokens == auto.all_special_tokens
  assert ours.chat_template == auto.chat_template
  probe = (f"import sys; from helpsteer_jax.models import hf; from helpsteer_jax.train import"
           f" metrics; hf.load_tokenizer({str(tok_dir)!r});"
           f" metrics.MetricsWriter({str(tmp_path / 'run')!r}, enabled=True).close();"
           " print('torch' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.stdout.strip() == "False", out.stderr[-2000:]
  assert list((tmp_path / "run" / "tensorboard").iterdir())
