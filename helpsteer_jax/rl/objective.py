"""The policy's log-probabilities of rollout tokens on the training mesh.

A rollout batch packs each prompt and its completion into one right-padded
row ([B, L], L = the longest prompt + max_new_tokens); the model's per-token
log-probabilities come from the fused projection (`losses.logprobs`, no
[B, L, vocab] logits) and are gathered at the completion tokens, [B, T] in
the rollouts' layout, so the losses in `losses.policy_gradient` read them
directly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from helpsteer_jax.losses.logprobs import token_logprobs
from helpsteer_jax.rl.rollout import Rollouts


def pack(rollouts: Rollouts, length: int, pad_id: int = 0) -> dict[str, np.ndarray]:
  """The model's inputs for `rollouts`: inputs, targets, positions, segment_ids [B, L]
  and `at` [B, T], the row position whose next-token prediction is each completion
  token (`mask` zero where there is none)."""
  b, t = rollouts.tokens.shape
  inputs = np.full((b, length), pad_id, np.int32)
  segment_ids = np.zeros((b, length), np.int32)
  at = np.zeros((b, t), np.int32)
  for i in range(b):
    prompt = rollouts.prompts[i // rollouts.k]
    n = int(rollouts.mask[i].sum())
    row = list(prompt) + rollouts.tokens[i, :n].tolist()
    if len(prompt) + t > length:
      raise ValueError(f"rollout {i}: a {len(prompt)}-token prompt and {t} new tokens do not"
                       f" fit rows of {length}")
    inputs[i, :len(row)], segment_ids[i, :len(row)] = row, 1
    at[i] = len(prompt) - 1 + np.arange(t)
  targets = np.concatenate([inputs[:, 1:], np.full((b, 1), pad_id, np.int32)], axis=1)
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), (b, length)).copy()
  return {"inputs": inputs, "targets": targets, "positions": positions,
          "segment_ids": segment_ids, "at": at}


def completion_logprobs(model: nnx.Module, batch: dict[str, jax.Array],
                        chunk_size: int = 256) -> jax.Array:
  """[B, T] log-probabilities of the completion tokens under `model` (fp32; padding
  positions hold the log-probability of the pad token, for the mask to drop)."""
  hidden = model(batch["inputs"], batch["positions"], batch["segment_ids"])
  lp = token_logprobs(hidden, model.head_weight(), batch["targets"], chunk_size,
                      model.cfg.final_logit_softcap)
  return jnp.take_along_axis(lp, batch["at"], axis=1)
