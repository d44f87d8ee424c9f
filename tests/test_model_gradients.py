"""Gradients of the model against PyTorch autograd, and the SwiGLU backward.

The MLP has a hand-written backward (models/swiglu.py); these tests hold it
to autodiff of the plain expression y = (act(x W_g) * (x W_u)) W_d (SiLU and
tanh-GELU) and the whole model's weight gradients to transformers'
LlamaForCausalLM and Gemma2ForCausalLM backward.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from torch_reference import needs_torch, torch

from helpsteer_jax.models import hf
from helpsteer_jax.models.swiglu import gated_mlp, swiglu

pytestmark = pytest.mark.version_tier


def _plain(x, wg, wu, wd, activation="silu"):
  act = jax.nn.silu if activation == "silu" else lambda g: jax.nn.gelu(g, approximate=True)
  return (act(x @ wg) * (x @ wu)) @ wd


def _operands(dtype, shape=(2, 24, 16), mlp=40):
  keys = jax.random.split(jax.random.key(0), 5)
  d = shape[-1]
  x = jax.random.normal(keys[0], shape, dtype)
  ws = [0.3 * jax.random.normal(k, s, dtype)
        for k, s in zip(keys[1:4], [(d, mlp), (d, mlp), (mlp, d)])]
  return x, *ws, jax.random.normal(keys[4], shape, dtype)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_gated_mlp_gradients_match_autodiff_fp32(activation):
  x, wg, wu, wd, dy = _operands(jnp.float32)
  mlp = lambda *a: gated_mlp(*a, activation)
  plain = lambda *a: _plain(*a, activation)
  ours = jax.jit(jax.grad(lambda *a: jnp.vdot(mlp(*a), dy), argnums=(0, 1, 2, 3)))
  ref = jax.jit(jax.grad(lambda *a: jnp.vdot(plain(*a), dy), argnums=(0, 1, 2, 3)))
  np.testing.assert_allclose(mlp(x, wg, wu, wd), plain(x, wg, wu, wd), rtol=1e-6, atol=1e-6)
  for a, b in zip(ours(x, wg, wu, wd), ref(x, wg, wu, wd)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_swiglu_gradients_bf16_and_under_remat():
  x, wg, wu, wd, dy = _operands(jnp.bfloat16)
  for policy in (None, jax.checkpoint_policies.dots_saveable,
                 jax.checkpoint_policies.nothing_saveable):
    fn = swiglu if policy is None else jax.checkpoint(swiglu, policy=policy)
    grads = jax.grad(lambda *a: jnp.vdot(fn(*a), dy).astype(jnp.float32),
                     argnums=(0, 1, 2, 3))(x, wg, wu, wd)
    ref = jax.grad(lambda *a: jnp.vdot(_plain(*a), dy).astype(jnp.float32),
                   argnums=(0, 1, 2, 3))(*(a.astype(jnp.float32) for a in (x, wg, wu, wd)))
    for a, b in zip(grads, ref):
      assert a.dtype == jnp.bfloat16
      scale = float(jnp.max(jnp.abs(b)))
      assert float(jnp.max(jnp.abs(a.astype(jnp.float32) - b))) < 0.03 * scale


_GRAD_CONFIGS = {
    "llama": lambda shape: transformers.LlamaConfig(**shape),
    # GeGLU, sandwich and (1 + w) norms, the window (5 of 24 tokens) and both
    # soft-caps, through the blockwise kernel's custom VJP.
    "gemma2": lambda shape: transformers.Gemma2Config(
        **shape, head_dim=8, query_pre_attn_scalar=12, sliding_window=5,
        attn_logit_softcapping=2.0, final_logit_softcapping=5.0),
}


@needs_torch
@pytest.mark.parametrize("kind", sorted(_GRAD_CONFIGS))
def test_model_weight_gradients_match_pytorch(tmp_path, kind):
  """d(sum of per-token cross-entropy)/d(every weight) vs the transformers
  model's backward(), compared through the family's HF parameter mapping."""
  torch.manual_seed(0)
  cfg = _GRAD_CONFIGS[kind](dict(
      vocab_size=128, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
      attn_implementation="eager"))
  ref = transformers.AutoModelForCausalLM.from_config(cfg).float()
  with torch.no_grad():  # norms away from their initial value (0 for Gemma, 1 for Llama)
    for name, p in ref.named_parameters():
      if "norm" in name:
        p.add_(0.2 * torch.randn_like(p))
  ref.save_pretrained(tmp_path)
  ours = hf.load_hf_model(str(tmp_path), attention_impl="blockwise", attention_block_size=8)
  tokens = np.random.RandomState(0).randint(0, 128, (2, 25))

  logits = ref(input_ids=torch.tensor(tokens[:, :-1])).logits
  torch.nn.functional.cross_entropy(logits.reshape(-1, 128),
                                    torch.tensor(tokens[:, 1:]).reshape(-1),
                                    reduction="sum").backward()

  from flax import nnx

  def loss(model):
    lp = jax.nn.log_softmax(model.logits(model(jnp.asarray(tokens[:, :-1]))), axis=-1)
    return -jnp.sum(jnp.take_along_axis(lp, jnp.asarray(tokens[:, 1:])[..., None], axis=-1))

  grads = nnx.jit(nnx.grad(loss))(ours)
  grads = {path: v.get_value() for path, v in nnx.to_flat_state(grads)}
  for m in hf.param_mappings(ours.cfg):
    names = ([m.hf_name.format(i=i) for i in range(cfg.num_hidden_layers)] if m.layered
             else [m.hf_name])
    for i, name in enumerate(names):
      want = m.to_ours(ref.get_parameter(name).grad.numpy())
      got = np.asarray(grads[m.path][i] if m.layered else grads[m.path])
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max(),
                                 err_msg=name)
