"""The policy's log-probabilities of rollout tokens on the training mesh.

A rollout batch packs each prompt and its completion into one right-padded
row ([B, L], L = the longest prompt + max_new_tokens); the model's per-token
final hidden states are gathered at the completion positions and their
log-probabilities come from the fused projection (`losses.logprobs`, no
[B, L, vocab] logits, no head matmul on the prompt), [B, T] in the rollouts'
layout, so the losses in `losses.policy_gradient` read them directly. The passes
over rollout rows run on `frozen_pass.FrozenPass`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from helpsteer_jax.data.batches import ROLLOUT_BATCH
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.losses.logprobs import token_logprobs
from helpsteer_jax.models import lora
from helpsteer_jax.rl.rollout import Rollouts
from helpsteer_jax.rl.settings import RLSettings


def pack(rollouts: Rollouts, length: int, pad_id: int = 0) -> dict[str, np.ndarray]:
  """The model's inputs for `rollouts`: inputs, targets, positions, segment_ids [B, L]
  and `at` [B, T], the row position whose next-token prediction is each completion
  token (`mask` zero where there is none). A row ends at its last masked token (a
  multi-turn row's mask has gaps: the user's turns)."""
  b, t = rollouts.tokens.shape
  inputs = np.full((b, length), pad_id, np.int32)
  segment_ids = np.zeros((b, length), np.int32)
  at = np.zeros((b, t), np.int32)
  for i in range(b):
    prompt = rollouts.prompts[i // rollouts.k]
    used = np.flatnonzero(rollouts.mask[i])
    n = int(used[-1]) + 1 if len(used) else 0  # through the last policy token
    row = list(prompt) + rollouts.tokens[i, :n].tolist()
    if len(row) > length:
      raise ValueError(f"rollout {i}: a {len(prompt)}-token prompt and {n} new tokens do not"
                       f" fit rows of {length}")
    inputs[i, :len(row)], segment_ids[i, :len(row)] = row, 1
    at[i] = np.minimum(len(prompt) - 1 + np.arange(t), length - 1)
  targets = np.concatenate([inputs[:, 1:], np.full((b, 1), pad_id, np.int32)], axis=1)
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), (b, length)).copy()
  return {"inputs": inputs, "targets": targets, "positions": positions,
          "segment_ids": segment_ids, "at": at}


def completion_logprobs(model: nnx.Module, batch: dict[str, jax.Array],
                        chunk_size: int = 256, temperature: float = 1.0) -> jax.Array:
  """[B, T] log-probabilities of the completion tokens under `model` at `temperature`
  (the distribution the rollouts were drawn from, before top-p; fp32; padding positions
  hold the log-probability of the pad token, for the mask to drop)."""
  hidden = model(batch["inputs"], batch["positions"], batch["segment_ids"])
  return hidden_logprobs(model, hidden, batch, chunk_size, temperature)


def hidden_logprobs(model: nnx.Module, hidden: jax.Array, batch: dict[str, jax.Array],
                    chunk_size: int = 256, temperature: float = 1.0) -> jax.Array:
  """`completion_logprobs` from `model`'s final hidden states [B, L, D] of the batch."""
  softcap = model.cfg.final_logit_softcap
  if temperature != 1.0:
    if softcap is not None:
      raise ConfigError("rollout.temperature != 1 with a soft-capped head (the cap applies"
                        " before the temperature): sample at temperature 1")
    hidden = hidden / jnp.asarray(temperature, hidden.dtype)
  # The head runs on the completion positions alone (as TRL's `logits_to_keep`): the
  # prompt's positions would cost vocabulary matmuls whose log-probabilities are unread.
  at = batch["at"]
  t = at.shape[1]
  h = jnp.take_along_axis(hidden, at[..., None], axis=1)
  targets = jnp.take_along_axis(batch["targets"], at, axis=1)
  pad = (-t) % chunk_size if 0 < chunk_size < t else 0
  if pad:
    h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
  return token_logprobs(h, model.head_weight(), targets, chunk_size, softcap)[:, :t]


def reference_logprobs(model: nnx.Module, batch: dict[str, jax.Array], reference: Any,
                       chunk_size: int = 256, temperature: float = 1.0) -> jax.Array:
  """[B, T] completion log-probabilities under the reference: `model` with its LoRA
  adapters off when `reference` is None (the base model, no second copy of the weights),
  else `reference`, frozen parameters of `model`'s graph."""
  if reference is None:
    with lora.disabled():
      return completion_logprobs(model, batch, chunk_size, temperature)
  trainable = nnx.LoRAParam if jax.tree.leaves(nnx.state(model, nnx.LoRAParam)) else nnx.Param
  graphdef, _, rest = nnx.split(model, trainable, ...)
  return completion_logprobs(nnx.merge(graphdef, reference, rest), batch, chunk_size,
                             temperature)


def policy_objective(model: nnx.Module, batch: dict[str, jax.Array], *,
                     settings: RLSettings, chunk_size: int = 256
                     ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(summed loss, sums) of a batch of rollout rows for the training loop.

  The batch holds `data.batches.ROLLOUT_BATCH` (the algorithm's schema may add its
  other models' fields): `pack`'s fields and, [B, T], `mask`, `advantages` (per token),
  `old_logp` (the policy that sampled, recomputed on this path; read only when
  `settings.recomputes_old_logp`, else the policy being trained is the one that
  sampled) and `ref_logp` (the reference's, for an algorithm whose loss reads it).
  The loss itself is the algorithm's (`rl.algorithms`).
  """
  s, b = settings, ROLLOUT_BATCH.view(batch)
  logp = completion_logprobs(model, batch, chunk_size, s.temperature)
  old = b.old_logp if s.recomputes_old_logp else jax.lax.stop_gradient(logp)
  total, weight, sums = s.algorithm.loss_sums(logp, old, b, s.loss)
  sums["weight"] = weight
  return total, sums
