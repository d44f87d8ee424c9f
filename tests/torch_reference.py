"""transformers' PyTorch models as the reference outputs of parity tests."""

import numpy as np


def logits(model, tokens, mask, positions) -> np.ndarray:
  """`model`'s logits (a causal LM's, or a sequence classifier's per-sequence scores) as fp32
  numpy, for numpy tokens / attention mask / position ids."""
  import torch
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions))
  return out.logits.float().numpy()
