"""A small byte-level BPE tokenizer trained on the demo data.

The CPU demo runs need a tokenizer without network access; this one is
trained deterministically on the demo corpus and saved as an HF tokenizer
directory (loadable with `transformers.AutoTokenizer`). The SteerLM markers
are single special tokens, as in NeMo's own tokenizers.
"""

from __future__ import annotations

import pathlib

from helpsteer_jax.data.demo import rows

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<extra_id_0>", "<extra_id_1>", "<extra_id_2>")
DEFAULT_VOCAB_SIZE = 1024


def build_demo_tokenizer(out_dir: str | pathlib.Path,
                         vocab_size: int = DEFAULT_VOCAB_SIZE) -> pathlib.Path:
  """Trains the tokenizer and saves it to `out_dir` (idempotent)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  out = pathlib.Path(out_dir)
  if (out / "tokenizer.json").exists():
    return out
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(rows.corpus(), trainer)
  fast = PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
      additional_special_tokens=list(SPECIAL_TOKENS[3:]))
  tmp = out.with_name(out.name + ".tmp")
  fast.save_pretrained(tmp)
  tmp.replace(out)
  return out
