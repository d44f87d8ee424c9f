"""transformers' PyTorch models as the reference outputs of parity tests.

PyTorch (and peft) are optional: on Python 3.12 PyPI only has the CUDA build of
torch. `torch` and `peft` are None when absent; a test that uses either as its
reference carries `needs_torch` / `needs_peft` and skips, the others still run.
"""

import importlib

import numpy as np
import pytest


def _optional(name: str):
  try:
    return importlib.import_module(name)
  except ImportError:
    return None


torch = _optional("torch")
peft = _optional("peft") if torch is not None else None

needs_torch = pytest.mark.skipif(
    torch is None, reason="PyTorch oracle unavailable: torch is not installed")
needs_peft = pytest.mark.skipif(
    peft is None, reason="PyTorch oracle unavailable: torch and peft are not both installed")


def logits(model, tokens, mask, positions) -> np.ndarray:
  """`model`'s logits (a causal LM's, or a sequence classifier's per-sequence scores) as fp32
  numpy, for numpy tokens / attention mask / position ids."""
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions))
  return out.logits.float().numpy()
