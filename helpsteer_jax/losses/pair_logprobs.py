"""The pair loss on the model: one policy forward for chosen and rejected.

A batch holds pairs (`data.batches.PAIR_BATCH`: token rows [B, 2, T],
per-segment scores and masks, and, unless the reference runs on the fly,
`CACHED_PAIR_BATCH`'s `ref_logps` [B, 2, S], the reference's per-segment
log-prob sums). The pair axis is folded into the batch (rows 2i, 2i+1 are
pair i, so a batch-sharded layout stays local) and the policy runs once over
all 2B rows.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from helpsteer_jax.data.batches import CACHED_PAIR_BATCH, PAIR_BATCH, REFERENCE_INPUT
from helpsteer_jax.losses import dpo2d
from helpsteer_jax.losses.logprobs import segment_logprob_sums
from helpsteer_jax.models import lora


def _fold(x: jax.Array) -> jax.Array:
  return x.reshape((-1,) + x.shape[2:])


def model_segment_logps(model: nnx.Module, batch: dict[str, jax.Array],
                        chunk_size: int = 256, vocab_chunk: int = 0) -> jax.Array:
  """Per-segment log-prob sums [B, 2, S] of both responses, one forward."""
  b = REFERENCE_INPUT.view(batch)
  pairs, s = b.seg_mask.shape[0], b.seg_mask.shape[-1]
  hidden = model(_fold(b.inputs), _fold(b.positions), _fold(b.segment_ids))
  sums = segment_logprob_sums(hidden, model.head_weight(), _fold(b.targets),
                              _fold(b.token_segments), s, chunk_size, vocab_chunk,
                              model.cfg.final_logit_softcap)
  return sums.reshape(pairs, 2, s)


def preference_loss(model: nnx.Module, batch: dict[str, jax.Array], reference: Any = None, *,
                    cfg: dpo2d.PreferenceLossConfig, chunk_size: int = 256,
                    vocab_chunk: int = 0, adapters_off_reference: bool = False):
  """(summed loss, summed metrics with `weight` = pairs) for the training loop.

  The reference log-probs: with `adapters_off_reference`, the same model with
  its LoRA adapters switched off (the base model, no second copy of the
  weights); else `reference`, frozen trainable parameters (same graph as
  `model`: the whole model, or the initial adapters under LoRA) run on the
  fly; else `batch["ref_logps"]` (a cached first pass). `vocab_chunk` > 0
  chunks the vocabulary projection instead of the sequence (less memory for
  large vocabularies).
  """
  cached = reference is None and not adapters_off_reference
  b = (CACHED_PAIR_BATCH if cached else PAIR_BATCH).view(batch)
  policy = model_segment_logps(model, batch, chunk_size, vocab_chunk)
  if adapters_off_reference:
    with lora.disabled():
      ref = jax.lax.stop_gradient(model_segment_logps(model, batch, chunk_size, vocab_chunk))
  elif reference is None:
    ref = b.ref_logps
  else:
    trainable = nnx.LoRAParam if jax.tree.leaves(nnx.state(model, nnx.LoRAParam)) else nnx.Param
    graphdef, _, rest = nnx.split(model, trainable, ...)
    ref_model = nnx.merge(graphdef, jax.lax.stop_gradient(reference), rest)
    ref = jax.lax.stop_gradient(model_segment_logps(ref_model, batch, chunk_size, vocab_chunk))
  with jax.named_scope("preference_loss"):
    inputs = dpo2d.PairInputs(policy=policy, reference=ref, scores=b.seg_scores,
                              mask=b.seg_mask > 0, lengths=b.lengths,
                              pair_weight=b.pair_weight[:, 0])
    losses, metrics = dpo2d.pair_losses(inputs, cfg)
    sums = {k: jnp.sum(v) for k, v in metrics.items()}
    sums["weight"] = jnp.sum(b.pair_weight[:, 0])
    return jnp.sum(losses), sums
