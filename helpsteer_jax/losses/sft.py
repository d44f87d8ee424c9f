"""Masked next-token cross-entropy for (attribute-conditioned) SFT."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from helpsteer_jax.data.batches import SFT_BATCH
from helpsteer_jax.losses.logprobs import weighted_nll


def sft_loss(model: nnx.Module, batch: dict[str, jax.Array], chunk_size: int = 256):
  """Summed NLL over loss tokens; `weight` (the normaliser) = number of loss tokens.

  The training loop divides by the weight summed over the whole global batch,
  i.e. the loss is the mean over all loss tokens of the batch (NeMo's
  token-level average), whatever the micro-batching.
  """
  b = SFT_BATCH.view(batch)
  hidden = model(b.inputs, b.positions, b.segment_ids)
  with jax.named_scope("sft_loss"):
    weights = b.weights * (b.segment_ids > 0)
    total = weighted_nll(hidden, model.head_weight(), b.targets, weights, chunk_size,
                         model.cfg.final_logit_softcap)
    return total, {"weight": jnp.sum(weights)}
