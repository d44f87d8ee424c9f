"""SteerLM markers that a tokenizer splits become single special tokens in AC-SFT.

Reference: transformers on the export's files alone (AutoTokenizer, GenerationConfig,
AutoModelForCausalLM and its `resize_token_embeddings`), against a byte-level BPE
tokenizer that, like SmolLM2's, has no `<extra_id_*>` tokens.
"""

import json

import jax
import numpy as np
import pytest
import transformers
from torch_reference import needs_torch, torch

from helpsteer_jax import sharding
from helpsteer_jax.data import chat_template, template
from helpsteer_jax.data.demo import rows as demo_rows
from helpsteer_jax.inference import generator
from helpsteer_jax.models import builder, catalog, hf

from cli_utils import TINY_RUN, run_main


@pytest.fixture(scope="module")
def split_tokenizer_dir(tmp_path_factory):
  """A byte-level BPE on the demo corpus whose only special tokens are pad, BOS and EOS."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(demo_rows.corpus(), trainers.BpeTrainer(
      vocab_size=512, special_tokens=["<pad>", "<s>", "</s>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  out = tmp_path_factory.mktemp("split") / "tokenizer"
  transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
  ).save_pretrained(out)
  return out


def test_markers_are_added_once_in_a_fixed_order(split_tokenizer_dir, tmp_path):
  tok = hf.load_tokenizer(split_tokenizer_dir)
  base = len(tok)
  assert chat_template.split_markers(tok) == list(chat_template.MARKERS)
  assert chat_template.add_marker_tokens(tok) == list(chat_template.MARKERS)
  assert tok.convert_tokens_to_ids(list(chat_template.MARKERS)) == [base, base + 1, base + 2]
  assert chat_template.add_marker_tokens(tok) == [] and len(tok) == base + 3
  # The demo tokenizer has them as single tokens already: nothing is added.
  from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
  demo = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path / "demo"))
  before = len(demo)
  assert chat_template.add_marker_tokens(demo) == [] and len(demo) == before


def test_vocab_sizes_for_added_tokens():
  assert builder.vocab_for_tokens(49152, 49155) == 49216
  assert builder.vocab_for_tokens(1024, 515) == 1024  # spare rows: no growth
  assert builder.vocab_for_tokens(512, 512) == 512


def _rows(model):
  embed = np.asarray(model.embed[...])
  head = np.asarray(model.lm_head[...]).T
  return embed, head


@needs_torch
def test_added_rows_are_initialised_as_transformers_resizes(tmp_path):
  # Reference: transformers' `resize_token_embeddings` (mean_resizing, its default) on the
  # same weights. Its draws and ours come from different generators; both lie within
  # sqrt(1e-9) standard deviations of the old rows' mean.
  cfg = catalog.model_config("tiny", vocab_size=500, tie_word_embeddings=False)
  model = builder.create(cfg, seed=1)
  hf.save_hf_model(model, tmp_path / "hf", dtype="float32")
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  grown = builder.add_token_rows(model, 500, 503, mesh, sharding.DEFAULT_RULES, seed=0)
  assert grown.cfg.vocab_size == 512
  embed, head = _rows(grown)
  old_embed, old_head = _rows(model)

  torch_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf",
                                                                  dtype=torch.float32)
  torch_model.resize_token_embeddings(512)
  want_embed = torch_model.get_input_embeddings().weight.detach().numpy()
  want_head = torch_model.get_output_embeddings().weight.detach().numpy()
  for got, want, old in ((embed, want_embed, old_embed), (head, want_head, old_head)):
    np.testing.assert_array_equal(got[:500], old)
    np.testing.assert_array_equal(want[:500], old)
    mean = old.mean(0)
    np.testing.assert_allclose(got[500:], want[500:], rtol=0, atol=1e-3 * old.std())
    # Drawn, not one repeated mean: spread like transformers' draws.
    spread, want_spread = (got[500:] - mean).std(), (want[500:] - mean).std()
    assert 0.5 < spread / want_spread < 2 and len(np.unique(got[500:], axis=0)) == 12
  again = builder.add_token_rows(model, 500, 503, mesh, sharding.DEFAULT_RULES, seed=0)
  np.testing.assert_array_equal(_rows(again)[0], embed)


def _acsft(tokenizer_dir, vocab, workdir, steps):
  return run_main("--config=configs/acsft.py", f"--workdir={workdir}", *TINY_RUN,
                  f"--config.tokenizer={tokenizer_dir}", f"--config.model.vocab_size={vocab}",
                  f"--config.train.num_steps={steps}", "--config.train.save_every=1",
                  "--config.train.export_dtype=float32",
                  "--config.data.demo_train_rows=32", "--config.data.demo_validation_rows=8")


def test_acsft_export_of_a_splitting_tokenizer_ends_turns_with_an_eos_id(split_tokenizer_dir,
                                                                         tmp_path):
  base = hf.load_tokenizer(split_tokenizer_dir)
  vocab, first = len(base), len(base)
  work = tmp_path / "acsft"
  _acsft(split_tokenizer_dir, vocab, work, steps=2)
  export = work / "hf"
  first_files = {name: (export / name).read_text()
                 for name in ("tokenizer.json", "config.json", "generation_config.json")}
  # Resumed from step 2: the same ids, and the checkpoint's vocab matches the grown model.
  _acsft(split_tokenizer_dir, vocab, work, steps=3)
  assert json.loads((work / "summary.json").read_text())["step"] == 3
  assert {name: (export / name).read_text() for name in first_files} == first_files

  tok = transformers.AutoTokenizer.from_pretrained(export)
  for i, marker in enumerate(chat_template.MARKERS):
    assert tok(marker, add_special_tokens=False)["input_ids"] == [first + i]
  marker = first + 1
  config = json.loads((export / "config.json").read_text())
  assert config["vocab_size"] == builder.vocab_for_tokens(vocab, vocab + 3) > vocab
  generation = transformers.GenerationConfig.from_pretrained(export)
  assert generation.eos_token_id == [tok.eos_token_id, marker]
  messages = [{"role": "user", "content": "Name two fruits."}]
  rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  assert rendered.count(template.TURN_START) == 2  # the same text, markers as single ids
  ids = tok(rendered, add_special_tokens=False)["input_ids"]
  assert ids.count(marker) == 2 and first + 2 in ids

  ours = hf.load_hf_model(export)
  assert ours.cfg.vocab_size == config["vocab_size"]
  # Our generation stops at the marker as one id, and `generate` runs on the export.
  ours_tok = hf.load_tokenizer(export)
  assert marker in generator.stop_ids(ours_tok, [template.TURN_START], [ours_tok.eos_token_id])
  prompts = tmp_path / "in.jsonl"
  prompts.write_text(json.dumps({"prompt": "Name two fruits."}) + "\n")
  run_main("--config=configs/generate.py", f"--workdir={tmp_path / 'gen'}",
           f"--config.init.source={export}", f"--config.input={prompts}",
           "--config.max_new_tokens=2", "--config.batch_size=1")
  assert json.loads((tmp_path / "gen" / "generations.jsonl").read_text())["prompt"]
  if torch is None:
    return
  model = transformers.AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
  assert model.get_input_embeddings().weight.shape[0] == config["vocab_size"]

  class MarkerSecond(transformers.LogitsProcessor):
    """The untrained model's second token is the marker: `generate` must stop there."""

    def __call__(self, input_ids, scores):
      if input_ids.shape[1] == len(ids) + 1:
        scores = torch.full_like(scores, -float("inf"))
        scores[:, marker] = 0.0
      return scores

  out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                       logits_processor=transformers.LogitsProcessorList([MarkerSecond()]))
  assert out.shape[1] == len(ids) + 2 and out[0, -1].item() == marker
