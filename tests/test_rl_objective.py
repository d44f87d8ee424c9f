"""The policy's log-probabilities of rollout tokens, recomputed on the training path.

References: the model's full logits, log-softmaxed in NumPy, at each completion token;
and the engine's own log-probabilities of the same tokens (what the sampler reports at
temperature 1), so the old-policy log-probs of a rollout agree between the two paths.
"""

import jax
import jax.numpy as jnp
import numpy as np

from helpsteer_jax import sharding
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.inference import generator
from helpsteer_jax.models import builder, catalog, hf
from helpsteer_jax.rl import objective, rollout

K, T, L = 2, 9, 40


def test_completion_logprobs_equal_the_full_forward_and_the_sampler(tmp_path):
  tok = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path / "tok"))
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  engine = generator.make_engine(model, mesh, tok, max_batch=4, max_length=64)
  prompts = [tok(t, add_special_tokens=False)["input_ids"]
             for t in ("Name two fruits.", "What is 2 plus 3? Answer in words, please.")]
  r = rollout.sample(engine, prompts, K, T, seed=1)
  batch = objective.pack(r, L)
  got = np.asarray(jax.jit(objective.completion_logprobs, static_argnums=2)(
      model, {k: jnp.asarray(v) for k, v in batch.items()}, 8))
  assert got.shape == (len(prompts) * K, T)

  for i in range(len(prompts) * K):
    n = int(r.mask[i].sum())
    row = prompts[i // K] + r.tokens[i, :n].tolist()
    logits = np.asarray(model.logits(model(jnp.asarray([row], jnp.int32))), np.float64)[0]
    logits -= logits.max(-1, keepdims=True)
    logsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    p = len(prompts[i // K])
    want = [logsm[p - 1 + j, row[p + j]] for j in range(n)]
    np.testing.assert_allclose(got[i, :n], want, atol=1e-5)
    np.testing.assert_allclose(got[i, :n], r.sampler_logp[i, :n], atol=1e-5)
