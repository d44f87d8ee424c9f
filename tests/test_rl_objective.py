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

from tolerances import BATCH_ATOL

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
    # Packed rows and the engine's batch against one row: not bitwise (tests/tolerances.py).
    np.testing.assert_allclose(got[i, :n], want, rtol=0, atol=BATCH_ATOL)
    np.testing.assert_allclose(got[i, :n], r.sampler_logp[i, :n], rtol=0, atol=BATCH_ATOL)


def test_one_step_per_rollout_needs_no_old_logprobs(tmp_path):
  """With one optimizer step per rollout batch the objective takes the policy being
  trained as the sampler (ratio exp(logp - stop_gradient(logp))): its loss and gradient
  equal those with the recomputed old log-probs."""
  import dataclasses
  import runpy

  from flax import nnx

  from helpsteer_jax.rl import settings as settings_lib

  from conftest import REPO_ROOT
  config = runpy.run_path(str(REPO_ROOT / "configs" / "rl.py"))["get_config"]()
  config.algorithm = "grpo"
  config.rollout.update(prompts_per_iteration=2, samples_per_prompt=K, max_new_tokens=T)
  config.train.update(global_batch=2 * K, seq_len=L)
  fast = settings_lib.read(config)
  assert not fast.recomputes_old_logp
  slow = dataclasses.replace(fast, recompute_logprobs=True)
  assert slow.recomputes_old_logp

  tok = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path / "tok"))
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  engine = generator.make_engine(model, mesh, tok, max_batch=4, max_length=64)
  prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("Hi.", "Name a color.")]
  r = rollout.sample(engine, prompts, K, T, seed=3)
  batch = {k: jnp.asarray(v) for k, v in objective.pack(r, L).items()}
  old = objective.completion_logprobs(model, batch, 8)
  rng = np.random.default_rng(0)
  batch.update(mask=jnp.asarray(r.mask), old_logp=old * r.mask,
               ref_logp=(old + jnp.asarray(rng.normal(0, 0.1, old.shape), jnp.float32))
               * r.mask,
               advantages=jnp.asarray(rng.normal(size=(2 * K, 1)) * r.mask, jnp.float32),
               sampler_weight=jnp.ones_like(old))

  def loss_and_grad(s):
    def f(m):
      return objective.policy_objective(m, batch, settings=s, chunk_size=8)[0]
    loss, grads = nnx.value_and_grad(f)(model)
    return float(loss), jax.tree.leaves(nnx.state(grads))

  (a, ga), (b, gb) = loss_and_grad(fast), loss_and_grad(slow)
  np.testing.assert_allclose(a, b, rtol=1e-6)
  for x, y in zip(ga, gb):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-7)
