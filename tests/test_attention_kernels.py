"""Accelerator attention kernels: splash (TPU) and cuDNN (GPU).

Splash runs here in Pallas interpret mode and must equal the XLA path (on
the real tokens: padding rows are masked out by every loss) forward and
backward; it is also compiled for a TPU topology. cuDNN cannot compile
without a GPU: its lowering for CUDA is checked instead.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

from helpsteer_jax import aot, config_base, runtime
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import attention
from helpsteer_jax.models.config import ModelConfig

pytestmark = pytest.mark.version_tier


def _inputs(b=2, t=128, h=4, k=2, d=32):
  rng = np.random.RandomState(0)
  q, kk, v = (jnp.asarray(rng.randn(b, t, n, d), jnp.float32) for n in (h, k, k))
  seg = np.ones((b, t), np.int32)
  seg[0, 50:] = 2      # two packed segments
  seg[1, 100:] = 0     # right padding
  return q, kk, v, jnp.asarray(seg)


@pytest.mark.parametrize("window,softcap", [(None, None), (40, 5.0)])
def test_splash_interpret_equals_xla_forward_and_backward(window, softcap):
  """Causal, or a 40-token `LocalMask` window with the kernel's logit soft-cap
  and a query scale other than 1/sqrt(head_dim) (Gemma 2)."""
  q, k, v, seg = _inputs()
  info = attention.MaskInfo(seg, seg, 0)
  knobs = dict(window=window, softcap=softcap, scale=0.1 if softcap else None)
  real = (np.asarray(seg) > 0)[:, :, None, None]
  w = jnp.asarray(np.random.RandomState(1).randn(*q.shape), jnp.float32) * real

  def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v) * w)

  xla = lambda q, k, v: attention.xla_attention(q, k, v, info, **knobs)
  splash = lambda q, k, v: attention.splash_attention(q, k, v, seg, 128, interpret=True,
                                                      **knobs)
  np.testing.assert_allclose(np.where(real, splash(q, k, v), 0), np.where(real, xla(q, k, v), 0),
                             atol=2e-5)
  for a, b in zip(jax.grad(loss(splash), (0, 1, 2))(q, k, v),
                  jax.grad(loss(xla), (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(a, b, atol=2e-5)


def test_kernel_platform_mismatch_is_a_config_error():
  config = config_base.base_config("unit")
  config.mesh = config_base.mesh_config(1, -1, 1)
  for impl, platform in (("splash", "TPU"), ("cudnn", "GPU")):
    config.model.attention_impl = impl
    with pytest.raises(ConfigError, match=f"runs only on {platform}.*blockwise"):
      runtime.setup(config)
  shape = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
               num_kv_heads=1)
  with pytest.raises(ConfigError, match="cudnn.*bfloat16"):
    ModelConfig(**shape, attention_impl="cudnn")
  with pytest.raises(ConfigError, match="cudnn' cannot soft-cap"):
    ModelConfig(**shape, attention_impl="cudnn", dtype="bfloat16", attn_logit_softcap=50.0)


@pytest.mark.parametrize("window,softcap", [(None, None), (64, 50.0)])
def test_splash_compiles_for_tpu_under_shard_map(tmp_path, window, softcap):
  topo = aot.parse_topology("v5e:2x2")
  mesh = sharding_lib.make_mesh((1, 2, 2), aot.compile_only_devices(topo, tmp_path))
  b, t, h, k, d = 4, 256, 8, 4, 128
  rules = sharding_lib.DEFAULT_RULES
  spec = lambda *axes: NamedSharding(mesh, sharding_lib.logical_to_spec(axes, rules))
  args = (jax.ShapeDtypeStruct((b, t, h, d), jnp.bfloat16,
                               sharding=spec("batch", "length", "heads", "head_dim")),
          jax.ShapeDtypeStruct((b, t, k, d), jnp.bfloat16,
                               sharding=spec("batch", "length", "kv_heads", "head_dim")),
          jax.ShapeDtypeStruct((b, t, k, d), jnp.bfloat16,
                               sharding=spec("batch", "length", "kv_heads", "head_dim")),
          jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=spec("batch", "length")))

  def loss(q, k, v, seg):
    with sharding_lib.axis_rules(rules):
      out = attention.attention(q, k, v, attention.MaskInfo(seg, seg, 0), "splash", 128,
                                window=window, softcap=softcap)
    return jnp.sum(out.astype(jnp.float32))

  with jax.set_mesh(mesh):
    compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(*args).compile()
  # Three Mosaic kernels (forward, dq, dk/dv), not an XLA fallback.
  assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == 3


def test_cudnn_lowers_to_flash_attention_for_cuda(monkeypatch):
  from jax._src.cudnn import fused_attention_stablehlo as cudnn
  # Only the GPU probes are replaced (there is no GPU); the lowering is real.
  monkeypatch.setattr(cudnn, "check_cudnn_version", lambda: 91000)
  monkeypatch.setattr(cudnn, "check_compute_capability", lambda capability: True)
  q, k, v, seg = (x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x
                  for x in _inputs(d=64))

  def loss(q, k, v):
    return jnp.sum(attention.cudnn_attention(q, k, v, seg).astype(jnp.float32))

  text = jax.jit(jax.grad(loss, (0, 1, 2))).trace(q, k, v).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "__cudnn$fmhaScaleBiasSoftmax(" in text and "__cudnn$fmhaScaleBiasSoftmaxBackward" in text
  assert '\\22is_flash_attention\\22: true' in text and '\\22mask_type\\22: \\22CAUSAL\\22' in text


def test_dense_attention_in_bf16_runs_batched_on_cpu():
  """A batch of bf16 rows through the dense path (decode, `xla`) runs on XLA:CPU, which has
  no batched bf16 x bf16 -> f32 dot, and equals the fp32 computation to bf16 precision
  (reference: the same attention in fp32)."""
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (3, 2, 6, 16))
  k, v = (jax.random.normal(key, (3, 2, 9, 16)) for key in keys[1:])
  mask = jnp.tril(jnp.ones((2, 9), bool), 7)[None].repeat(3, 0)
  dense = jax.jit(attention._dense, static_argnums=(4, 5))
  low = dense(*(x.astype(jnp.bfloat16) for x in (q, k, v)), mask, None, None)
  assert low.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(low, np.float32), dense(q, k, v, mask, None, None),
                             atol=3e-2)
