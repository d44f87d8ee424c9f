"""Decoder behaviour: attention kernels, packing, scan/remat, dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpsteer_jax import sharding
from helpsteer_jax.models import attention, builder, catalog, families

from tolerances import BATCH_ATOL

# A tiny Gemma 2: every family knob on, three layers (sliding, full, sliding:
# one scanned pair plus an unrolled remainder), a window shorter than the rows.
GEMMA2 = dict(families.get("gemma2").config_fields(), num_layers=3, head_dim=16,
              query_pre_attn_scalar=24, attn_logit_softcap=3.0, final_logit_softcap=10.0,
              sliding_window=6, layer_types=("sliding_attention", "full_attention"),
              tie_word_embeddings=True)


def _tier(*values):
  """A case the version tier runs too (the others: the full run alone)."""
  return pytest.param(*values, marks=pytest.mark.version_tier)


def _model(family=None, **overrides):
  return builder.create(catalog.model_config("tiny", **(family or {}), **overrides))


def _with_cfg(model, family=None, **changes):
  """The same weights under a different ModelConfig (e.g. another kernel)."""
  other = _model(family, **changes)
  nnx.update(other, nnx.state(model))
  return other


def _packed_inputs(batch=2, length=48, seed=0):
  rng = np.random.RandomState(seed)
  tokens = rng.randint(0, 1024, (batch, length)).astype(np.int32)
  # Row 0: two packed segments then padding; row 1: one segment, left padded.
  seg = np.zeros((batch, length), np.int32)
  seg[0, :20], seg[0, 20:40] = 1, 2
  seg[1, 8:] = 1
  pos = np.zeros_like(seg)
  for b in range(batch):
    for s in np.unique(seg[b][seg[b] > 0]):
      idx = np.where(seg[b] == s)[0]
      pos[b, idx] = np.arange(len(idx))
  return jnp.asarray(tokens), jnp.asarray(pos), jnp.asarray(seg)


def _reference_attention(q, k, v, seg, window=None, softcap=None, scale=None):
  """Dense softmax attention in NumPy-style jnp, with repeat_kv as in HF
  (and HF's eager soft-cap and sliding-window mask)."""
  rep = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
  t = q.shape[1]
  scores = jnp.einsum("bthd,bshd->bhts", q, k) * (scale or 1 / np.sqrt(q.shape[-1]))
  if softcap:
    scores = softcap * jnp.tanh(scores / softcap)
  q_idx, kv_idx = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
  mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0) & (q_idx >= kv_idx)
  if window:
    mask &= kv_idx > q_idx - window
  scores = jnp.where(mask[:, None], scores, -1e30)
  return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, -1), v)


@pytest.mark.parametrize("impl,block,window,softcap", [
    _tier("xla", 0, None, None), ("blockwise", 16, None, None), ("blockwise", 48, None, None),
    ("blockwise", 20, None, None), ("xla", 0, 7, 2.0), _tier("blockwise", 16, 7, 2.0),
    _tier("blockwise", 20, 24, None), ("blockwise", 16, None, 1.5)])
def test_attention_kernels_match_reference_forward_and_gradient(impl, block, window, softcap):
  """With a sliding window (7: a 16-query block skips whole key blocks) and
  soft-capping, forward and custom-VJP gradients equal the dense reference."""
  key = jax.random.split(jax.random.key(1), 3)
  q = jax.random.normal(key[0], (2, 48, 4, 8))
  k = jax.random.normal(key[1], (2, 48, 2, 8))
  v = jax.random.normal(key[2], (2, 48, 2, 8))
  _, _, seg = _packed_inputs()
  info = attention.MaskInfo(seg, seg, 0)
  valid = (seg > 0)[:, :, None, None]

  def loss(fn, q, k, v):
    return jnp.sum((fn(q, k, v) * valid) ** 2)

  scale = 0.3 if softcap else None
  ours = lambda q, k, v: attention.attention(q, k, v, info, impl, block, scale=scale,
                                             window=window, softcap=softcap)
  ref = lambda q, k, v: _reference_attention(q, k, v, seg, window, softcap, scale)
  np.testing.assert_allclose(jax.jit(ours)(q, k, v) * valid, ref(q, k, v) * valid, atol=1e-5)
  g_ours = jax.jit(jax.grad(lambda *a: loss(ours, *a), argnums=(0, 1, 2)))(q, k, v)
  g_ref = jax.jit(jax.grad(lambda *a: loss(ref, *a), argnums=(0, 1, 2)))(q, k, v)
  for a, b in zip(g_ours, g_ref):
    np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("new_tokens,window", [(1, None), (3, None), (1, 4), _tier(3, 5)])
def test_cached_attention_equals_reference_on_heads_first_cache(new_tokens, window):
  """Decode attention over a [B, K, S, D] cache: left padding, filled slots
  only (with a window: the window's slots only, read as a slice)."""
  key = jax.random.split(jax.random.key(2), 3)
  length, start = 16, 9  # slots start..start+new_tokens-1 hold the new tokens
  q = jax.random.normal(key[0], (2, new_tokens, 4, 8))
  k = jax.random.normal(key[1], (2, length, 2, 8))
  v = jax.random.normal(key[2], (2, length, 2, 8))
  filled = np.zeros((2, length), np.int32)
  filled[0, :start + new_tokens] = 1
  filled[1, 3:start + new_tokens] = 1  # row 1 left-padded by 3
  info = attention.MaskInfo(jnp.ones((2, new_tokens), jnp.int32), jnp.asarray(filled), start)
  ours = attention.cached_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), info,
                                    window=window)
  # Reference: HF's repeat_kv, dense softmax over filled slots up to each query.
  rep_k, rep_v = jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2)
  scores = jnp.einsum("bthd,bshd->bhts", q, rep_k) / np.sqrt(8)
  q_pos = start + np.arange(new_tokens)
  kv_pos = np.arange(length)[None, None, :]
  visible = (filled[:, None, :] > 0) & (kv_pos <= q_pos[None, :, None])
  if window:
    visible &= kv_pos > q_pos[None, :, None] - window
  scores = jnp.where(visible[:, None], scores, -1e30)
  ref = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, -1), rep_v)
  np.testing.assert_allclose(ours, ref, atol=1e-5)


@pytest.mark.version_tier
@pytest.mark.parametrize("family", [None, GEMMA2], ids=["llama", "gemma2"])
def test_packed_segments_equal_separate_sequences(family):
  """Packed rows (segments of 20 tokens; Gemma 2's window is 6) equal each
  sequence run alone (within BATCH_ATOL: other shapes, another reduction order)."""
  model = _model(family, attention_impl="blockwise", attention_block_size=16)
  tokens, pos, seg = _packed_inputs()
  forward = nnx.jit(lambda m, *args: m(*args))
  packed = forward(model, tokens, pos, seg)
  for start, stop in ((0, 20), (20, 40)):
    alone = forward(model, tokens[:1, start:stop])
    np.testing.assert_allclose(packed[0, start:stop], alone[0], rtol=0, atol=BATCH_ATOL)
  # Left padding does not change the real tokens' states.
  alone = forward(model, tokens[1:, 8:])
  np.testing.assert_allclose(packed[1, 8:], alone[0], rtol=0, atol=BATCH_ATOL)


@pytest.mark.parametrize("family,changes", [
    (None, dict(scan_layers=False)),
    _tier(None, dict(remat_policy="full")),
    (None, dict(remat_policy="save_dots")),
    (None, dict(remat_policy="save_dots_no_batch", scan_layers=False)),
    (None, dict(attention_impl="xla")),
    # Layers scanned in (sliding, full) pairs + a remainder, blockwise, vs one
    # by one, rematerialised, dense.
    _tier(GEMMA2, dict(scan_layers=False, remat_policy="full", attention_impl="xla")),
], ids=["unscanned", "full", "save_dots", "no_batch_unscanned", "xla", "gemma2"])
def test_execution_knobs_do_not_change_results(family, changes):
  knobs = dict(attention_impl="blockwise", attention_block_size=16)
  base = _model(family, **knobs)
  other = _with_cfg(base, family, **{**knobs, **changes})
  tokens, pos, seg = _packed_inputs()

  def loss(m):
    h = m(tokens, pos, seg)
    return jnp.sum(m.logits(h) * (seg > 0)[..., None]) / 100

  l1, g1 = nnx.jit(nnx.value_and_grad(loss))(base)
  l2, g2 = nnx.jit(nnx.value_and_grad(loss))(other)
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.version_tier
def test_blockwise_window_skips_key_blocks():
  """A 16-token window: each 16-query block reads 31 keys instead of all up
  to its end, so the compiled kernel does well under half the FLOPs."""
  q = jnp.zeros((1, 256, 2, 8))
  k = v = jnp.zeros((1, 256, 1, 8))
  seg = jnp.ones((1, 256), jnp.int32)

  def flops(window):
    fn = lambda q, k, v: attention.blockwise_attention(q, k, v, seg, 16, window=window)
    return jax.jit(fn).lower(q, k, v).compile().cost_analysis()["flops"]

  assert flops(16) < 0.4 * flops(None)


@pytest.mark.version_tier
def test_bf16_compute_with_fp32_master_weights():
  model = _model(dtype="bfloat16", param_dtype="float32")
  tokens, pos, seg = _packed_inputs()
  forward = nnx.jit(lambda m, *args: m(*args))
  hidden = forward(model, tokens, pos, seg)
  assert hidden.dtype == jnp.bfloat16
  assert model.logits(hidden).dtype == jnp.float32
  assert model.layers.attn.q_proj[...].dtype == jnp.float32
  ref = forward(_with_cfg(model), tokens, pos, seg)
  valid = (seg > 0)[..., None]
  err = jnp.max(jnp.abs((hidden.astype(jnp.float32) - ref) * valid))
  assert err < 0.1 * jnp.max(jnp.abs(ref)), err


@pytest.mark.version_tier
def test_forward_under_mesh_constrains_activations():
  mesh = sharding.make_mesh((2, 2, 2))
  model = _model(attention_impl="blockwise", attention_block_size=16)
  tokens, pos, seg = _packed_inputs(batch=4)
  graphdef, state = nnx.split(model)

  @jax.jit
  def fwd(state, tokens, pos, seg):
    m = nnx.merge(graphdef, state)
    return m(tokens, pos, seg)

  expected = fwd(state, tokens, pos, seg)
  state = jax.device_put(state, jax.NamedSharding(mesh, jax.P()))
  with jax.set_mesh(mesh), sharding.axis_rules(sharding.DEFAULT_RULES):
    spec = sharding.batch_spec(sharding.DEFAULT_RULES)
    args = [jax.device_put(x, jax.NamedSharding(mesh, spec)) for x in (tokens, pos, seg)]
    out = fwd(state, *args)
  assert out.sharding.spec[0] == ("data", "fsdp")
  np.testing.assert_allclose(out, expected, atol=1e-5)


@pytest.mark.version_tier
@pytest.mark.parametrize("mesh_shape", [(2, 4, 1), (1, 4, 2)])
def test_embedding_keeps_its_table_sharded(mesh_shape):
  """The lookup gathers token ids, not the table (whose gradient would then be
  a full fp32 [vocab, hidden] scatter on every device under FSDP; XLA:TPU
  scatter-adds into the local shard), and equals the single-device values."""
  mesh = sharding.make_mesh(mesh_shape)
  model = _model()
  graphdef, state = nnx.split(model)
  tokens, _, _ = _packed_inputs(batch=8)

  def loss(state, tokens):
    x = nnx.merge(graphdef, state).embed_tokens(tokens).astype(jnp.float32)
    return jnp.sum(x * jnp.arange(x.shape[-1]))

  step = jax.jit(jax.value_and_grad(loss))
  expected, expected_grad = step(state, tokens)
  rules = sharding.DEFAULT_RULES
  state = jax.device_put(state, builder.state_shardings(state, mesh, rules))
  with jax.set_mesh(mesh), sharding.axis_rules(rules):
    tokens = jax.device_put(tokens, jax.NamedSharding(mesh, sharding.batch_spec(rules)))
    compiled = step.lower(state, tokens).compile()
    value, grad = compiled(state, tokens)
  np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(grad["embed"][...], expected_grad["embed"][...], atol=1e-6)
  vocab = model.cfg.vocab_size // mesh_shape[2]
  gathers = [line.split("=")[1] for line in compiled.as_text().splitlines()
             if " all-gather(" in line]
  assert not [g for g in gathers if f"f32[{vocab}," in g or f"bf16[{vocab}," in g], gathers


@pytest.mark.version_tier
@pytest.mark.parametrize("length", [48, 44])
def test_chunked_logits_equal_one_matmul(length):
  model = _model(logits_chunk_size=16)
  tokens, pos, seg = _packed_inputs(length=48)
  hidden = nnx.jit(lambda m, t: m(t))(model, tokens[:, :length])
  chunked = nnx.jit(lambda m, h: m.logits(h))(model, hidden)
  whole = jnp.einsum("btd,dv->btv", hidden, model.lm_head[...])
  assert chunked.shape == (2, length, 1024)
  np.testing.assert_allclose(chunked, whole, atol=1e-5)


@pytest.mark.version_tier
def test_named_scopes_in_compiled_program():
  """Profiles read by block: the compiled forward + backward's op names carry
  the embedding, layer, norm, attention (kernel), MLP and head scopes."""
  import re
  model = _model(dict(GEMMA2, qk_norm=True), attention_impl="blockwise",
                 attention_block_size=16)
  graphdef, state = nnx.split(model)

  def loss(state, tokens):
    m = nnx.merge(graphdef, state)
    return m.logits(m(tokens)).sum()

  text = jax.jit(jax.grad(loss)).lower(state, jnp.zeros((1, 32), jnp.int32)).compile().as_text()
  scopes = {word for name in re.findall(r'op_name="([^"]+)"', text)
            for word in re.findall(r"\w+", name)}
  for scope in ("embed", "decoder_layer", "input_norm", "attention", "qk_norm",
                "attention_blockwise", "blockwise_fwd", "blockwise_bwd", "attn_output_norm",
                "post_attention_norm", "mlp", "mlp_output_norm", "final_norm", "lm_head"):
    assert scope in scopes, scope


def test_fused_losses_apply_the_final_soft_cap():
  """SFT NLL and per-segment log-prob sums on a Gemma 2 model equal the ones
  from `Decoder.logits` (soft-capped as HF's Gemma2ForCausalLM does, which
  test_hf_checkpoints checks), values and weight gradients."""
  from helpsteer_jax.losses.logprobs import segment_logprob_sums
  from helpsteer_jax.losses.sft import sft_loss
  model = _model(GEMMA2)
  tokens, pos, seg = (jnp.asarray(x) for x in _packed_inputs(length=32))
  targets = jnp.roll(tokens, -1, axis=1)
  weights = (seg > 0).astype(jnp.float32)
  batch = dict(inputs=tokens, targets=targets, positions=pos, segment_ids=seg, weights=weights)

  def reference_logprobs(m):
    logp = jax.nn.log_softmax(m.logits(m(tokens, pos, seg)), -1)
    return jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]

  def grads(fn):
    return nnx.jit(nnx.grad(fn))(model)["embed"][...]

  ours = lambda m: sft_loss(m, batch, chunk_size=8)[0]
  ref = lambda m: -jnp.sum(reference_logprobs(m) * weights)
  np.testing.assert_allclose(nnx.jit(ours)(model), nnx.jit(ref)(model), rtol=1e-5)
  np.testing.assert_allclose(grads(ours), grads(ref), atol=1e-5)

  mix = jnp.array([0.3, -1.1])
  for vocab_chunk in (0, 64):
    sums = lambda m: segment_logprob_sums(m(tokens, pos, seg), m.head_weight(), targets, seg,
                                          2, 8, vocab_chunk, m.cfg.final_logit_softcap)
    ref_sums = lambda m: jnp.stack(
        [jnp.sum(jnp.where(seg == k, reference_logprobs(m), 0.0), -1) for k in (1, 2)], -1)
    np.testing.assert_allclose(nnx.jit(sums)(model), nnx.jit(ref_sums)(model), rtol=1e-5)
    np.testing.assert_allclose(grads(lambda m: jnp.sum(sums(m) * mix)),
                               grads(lambda m: jnp.sum(ref_sums(m) * mix)), atol=1e-5)
