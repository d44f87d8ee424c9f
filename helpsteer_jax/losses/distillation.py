"""The per-token reverse KL of on-policy distillation, from hidden states.

At each completion position t, with student logits z_s and teacher logits z_t
(each model's final hidden state times its head, soft-capped where the model
caps, then divided by the sampling temperature as TRL's `generalized_jsd_loss`
divides both):

  KL_t = sum_v p_s(v) (log p_s(v) - log p_t(v)),  p = softmax(z / temperature)

the full-vocabulary reverse KL(student || teacher): TRL's GKD loss at beta=1
(`trl/trainer/gkd_trainer.py`, `generalized_jsd_loss`: F.kl_div(teacher_log_probs,
student_log_probs, log_target=True) = p_s (log p_s - log p_t)), which is NeMo-RL's
DistillationLossFn with `kl_type="reverse"` (`nemo_rl/algorithms/loss_functions.py`)
over the whole vocabulary instead of the teacher's top-k logits.

The positions run in chunks: a chunk's [B, c, V] logits exist inside one loop
iteration only, and the backward pass recomputes them (`jax.checkpoint` per chunk),
so no [B, T, V] array is ever live. The gradient flows into the student's hidden
states and head; the teacher's are constants.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from helpsteer_jax import unrollable
from helpsteer_jax.losses.logprobs import _gathered, _project


def at_positions(hidden: jax.Array, at: jax.Array) -> jax.Array:
  """[B, T, D] hidden states of the row positions `at` [B, T] of `hidden` [B, L, D]."""
  return jnp.take_along_axis(hidden, at[..., None], axis=1)


def log_softmax_logits(hidden: jax.Array, weight: jax.Array, temperature: float = 1.0,
                       softcap: float | None = None) -> jax.Array:
  """fp32 [B, c, V] log softmax((soft-capped) hidden @ weight / temperature)."""
  return jax.nn.log_softmax(_project(hidden, weight, softcap) / temperature, axis=-1)


def _chunk_kl(hs, ws, ht, wt, temperature, softcaps):
  lps = log_softmax_logits(hs, ws, temperature, softcaps[0])
  lpt = log_softmax_logits(ht, wt, temperature, softcaps[1])
  return jnp.sum(jnp.exp(lps) * (lps - lpt), axis=-1)


def reverse_kl(student_hidden: jax.Array, student_weight: jax.Array,
               teacher_hidden: jax.Array, teacher_weight: jax.Array, chunk_size: int = 256,
               temperature: float = 1.0, student_softcap: float | None = None,
               teacher_softcap: float | None = None) -> jax.Array:
  """fp32 [B, T] KL(student || teacher) per position of the [B, T, D_s] and [B, T, D_t]
  hidden states, with heads [D_s, V] and [D_t, V] (one vocabulary); T in chunks of
  `chunk_size` (<= 0: one chunk; the last one padded)."""
  b, t = student_hidden.shape[:2]
  if student_weight.shape[1] != teacher_weight.shape[1]:
    raise ValueError(f"the student's vocabulary ({student_weight.shape[1]}) and the"
                     f" teacher's ({teacher_weight.shape[1]}) differ")
  c = t if chunk_size <= 0 else min(chunk_size, t)
  n = -(-t // c)
  if n * c != t:  # the last chunk padded with zero states, dropped below
    pad = ((0, 0), (0, n * c - t), (0, 0))
    student_hidden, teacher_hidden = jnp.pad(student_hidden, pad), jnp.pad(teacher_hidden, pad)
  ws = _gathered(student_weight)
  wt = _gathered(jax.lax.stop_gradient(teacher_weight))
  ht = jax.lax.stop_gradient(teacher_hidden)
  softcaps = (student_softcap, teacher_softcap)
  chunk = jax.checkpoint(lambda hs_, ws_, ht_, wt_: _chunk_kl(hs_, ws_, ht_, wt_, temperature,
                                                                softcaps))

  def split(h):  # [B, T, D] -> [n, B, c, D]
    return jnp.moveaxis(h.reshape(b, n, c, h.shape[-1]), 1, 0)

  with jax.named_scope("reverse_kl"):
    _, kl = unrollable.scan(lambda carry, xs: (carry, chunk(xs[0], ws, xs[1], wt)), None,
                            (split(student_hidden), split(ht)))
  return jnp.moveaxis(kl, 0, 1).reshape(b, n * c)[:, :t]
