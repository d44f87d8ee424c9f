"""The reward model's head: where it reads, in fp32, with left or right padding."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from helpsteer_jax.models import catalog
from helpsteer_jax.models.decoder import Decoder
from helpsteer_jax.models.reward import RewardModel, last_token_index


def _model():
  cfg = catalog.model_config("tiny", attention_block_size=16)
  model = RewardModel(Decoder(cfg, rngs=nnx.Rngs(0)), head_bias=True)
  rng = np.random.RandomState(0)
  model.head.kernel[...] = jnp.asarray(rng.normal(0, 0.5, model.head.kernel.shape), jnp.float32)
  model.head.bias[...] = jnp.asarray(rng.normal(0, 1, (9,)), jnp.float32)
  return model


def test_last_token_index_for_left_and_right_padding():
  seg = jnp.asarray([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(last_token_index(seg), [2, 4, 4, 0])


def test_head_reads_the_last_real_token_with_left_or_right_padding():
  model = _model()
  assert not hasattr(model.backbone, "lm_head")
  assert model.head.kernel[...].dtype == jnp.float32 and model.head.bias.shape == (9,)
  rng = np.random.RandomState(1)
  seqs = [rng.randint(3, 1000, n) for n in (5, 11, 8)]
  score_last = nnx.jit(lambda m, t, p, s: m.score_last(t, p, s))
  per_token_fn = nnx.jit(lambda m, t, p, s: m(t, p, s))
  alone = np.stack([np.asarray(score_last(model, jnp.asarray(s[None]),
                                                jnp.arange(len(s))[None],
                                                jnp.ones((1, len(s)), jnp.int32)))[0]
                    for s in seqs])
  # The head on the hidden state after the final norm at the last token, by hand.
  s = seqs[1]
  hidden = nnx.jit(lambda m, t: m.backbone(t))(model, jnp.asarray(s[None]))[0, -1]
  by_hand = np.asarray(hidden, np.float64) @ np.asarray(model.head.kernel[...], np.float64) \
      + np.asarray(model.head.bias[...], np.float64)
  np.testing.assert_allclose(alone[1], by_hand, rtol=1e-5, atol=1e-5)
  length = 16
  for side in ("right", "left"):
    tokens = np.zeros((3, length), np.int32)
    seg = np.zeros((3, length), np.int32)
    pos = np.zeros((3, length), np.int32)
    for i, s in enumerate(seqs):
      sl = slice(0, len(s)) if side == "right" else slice(length - len(s), length)
      tokens[i, sl], seg[i, sl], pos[i, sl] = s, 1, np.arange(len(s))
    padded = np.asarray(score_last(model, jnp.asarray(tokens), jnp.asarray(pos), jnp.asarray(seg)))
    np.testing.assert_allclose(padded, alone, rtol=1e-5, atol=1e-5, err_msg=side)
    per_token = np.asarray(per_token_fn(model, jnp.asarray(tokens), jnp.asarray(pos),
                                        jnp.asarray(seg)))
    last = np.asarray(last_token_index(jnp.asarray(seg)))
    np.testing.assert_allclose(per_token[np.arange(3), last], alone, rtol=1e-5, atol=1e-5)
