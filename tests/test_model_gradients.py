"""Gradients of the model against PyTorch autograd, and the SwiGLU backward.

The MLP has a hand-written backward (models/swiglu.py); these tests hold it
to autodiff of the plain expression y = (silu(x W_g) * (x W_u)) W_d and the
whole model's weight gradients to transformers' LlamaForCausalLM backward.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpsteer_jax.models import hf
from helpsteer_jax.models.swiglu import swiglu

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _plain(x, wg, wu, wd):
  return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd


def _operands(dtype, shape=(2, 24, 16), mlp=40):
  keys = jax.random.split(jax.random.key(0), 5)
  d = shape[-1]
  x = jax.random.normal(keys[0], shape, dtype)
  ws = [0.3 * jax.random.normal(k, s, dtype)
        for k, s in zip(keys[1:4], [(d, mlp), (d, mlp), (mlp, d)])]
  return x, *ws, jax.random.normal(keys[4], shape, dtype)


def test_swiglu_gradients_match_autodiff_fp32():
  x, wg, wu, wd, dy = _operands(jnp.float32)
  ours = jax.jit(jax.grad(lambda *a: jnp.vdot(swiglu(*a), dy), argnums=(0, 1, 2, 3)))
  ref = jax.jit(jax.grad(lambda *a: jnp.vdot(_plain(*a), dy), argnums=(0, 1, 2, 3)))
  np.testing.assert_allclose(swiglu(x, wg, wu, wd), _plain(x, wg, wu, wd), rtol=1e-6, atol=1e-6)
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


def test_model_weight_gradients_match_pytorch(tmp_path):
  """d(sum of per-token cross-entropy)/d(weights) vs LlamaForCausalLM.backward()."""
  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=80,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=64,
                                 attn_implementation="eager")
  ref = transformers.LlamaForCausalLM(cfg).float()
  ref.save_pretrained(tmp_path)
  ours = hf.load_hf_model(str(tmp_path), attention_impl="blockwise", attention_block_size=8)
  tokens = np.random.RandomState(0).randint(0, 128, (2, 25))

  logits = ref(input_ids=torch.tensor(tokens[:, :-1])).logits
  torch.nn.functional.cross_entropy(logits.reshape(-1, 128), torch.tensor(tokens[:, 1:]).reshape(-1),
                                    reduction="sum").backward()

  from flax import nnx

  def loss(model):
    lp = jax.nn.log_softmax(model.logits(model(jnp.asarray(tokens[:, :-1]))), axis=-1)
    return -jnp.sum(jnp.take_along_axis(lp, jnp.asarray(tokens[:, 1:])[..., None], axis=-1))

  grads = nnx.grad(loss)(ours)
  layers = grads.layers
  for i in range(cfg.num_hidden_layers):
    block = ref.model.layers[i]
    pairs = {
        "gate": (layers.mlp.gate_proj[...][i], block.mlp.gate_proj.weight.grad.T),
        "up": (layers.mlp.up_proj[...][i], block.mlp.up_proj.weight.grad.T),
        "down": (layers.mlp.down_proj[...][i], block.mlp.down_proj.weight.grad.T),
        "q": (layers.attn.q_proj[...][i].reshape(32, -1), block.self_attn.q_proj.weight.grad.T),
        "norm": (layers.post_attention_norm.scale[...][i],
                 block.post_attention_layernorm.weight.grad),
    }
    for name, (a, b) in pairs.items():
      b = b.numpy()
      np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-5 * np.abs(b).max(),
                                 err_msg=f"layer {i} {name}")
  np.testing.assert_allclose(np.asarray(grads.embed[...]), ref.model.embed_tokens.weight.grad.numpy(),
                             rtol=1e-4, atol=1e-6)
