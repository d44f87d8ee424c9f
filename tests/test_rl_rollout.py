"""Rollouts from the engine's batch API: shapes, masks, seeds, log-probabilities.

References: the engine's own outputs for the same requests (tests/test_engine.py checks
those against the model's forward), and its raw log-probabilities, which at temperature
1 and top-p 1 are the sampling distribution's.
"""

import jax
import numpy as np
import pytest

from helpsteer_jax import sharding
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.inference import generator
from helpsteer_jax.inference.engine import DecodeRequest
from helpsteer_jax.inference.sampling import sample_seed
from helpsteer_jax.models import builder, catalog, hf
from helpsteer_jax.rl import rollout

from tolerances import BATCH_ATOL

K, T = 3, 10


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  tok = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path_factory.mktemp("tok")))
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  engine = generator.make_engine(model, mesh, tok, max_batch=4, max_length=64)
  prompts = [tok(t, add_special_tokens=False)["input_ids"]
             for t in ("Name two fruits.", "What is 2 plus 3? Answer in words.")]
  return engine, prompts


def test_rollouts_are_the_engines_completions_padded_and_masked(setup):
  engine, prompts = setup
  r = rollout.sample(engine, prompts, K, T, seed=5, step=2, pad_id=0)
  assert r.tokens.shape == r.mask.shape == r.sampler_logp.shape == (len(prompts) * K, T)
  for b in range(len(prompts) * K):
    i, j = divmod(b, K)
    want = engine.generate([DecodeRequest(prompts[i], T, temperature=1.0,
                                          seed=sample_seed(5, 2, i, j))])[0]
    n = len(want.token_ids)
    assert r.tokens[b, :n].tolist() == want.token_ids and r.mask[b].sum() == n
    assert not r.mask[b, n:].any() and not r.tokens[b, n:].any()
    # The batch's log-probs against the request's alone: not bitwise (tests/tolerances.py).
    np.testing.assert_allclose(r.sampler_logp[b, :n], want.logprobs, rtol=0, atol=BATCH_ATOL)
    # Temperature 1, top-p 1: the sampling distribution is the model's.
    np.testing.assert_allclose(r.sampler_logp[b, :n], want.raw.chosen, rtol=0, atol=BATCH_ATOL)
    assert r.finished[b] == (want.finish_reason == "stop") and r.texts[b] == want.text
    assert r.finished[b] or n == T
  # The samples of a prompt differ; the same (seed, step) draws them again.
  assert len({tuple(row) for row in r.tokens[:K].tolist()}) > 1
  again = rollout.sample(engine, prompts, K, T, seed=5, step=2)
  np.testing.assert_array_equal(again.tokens, r.tokens)
  other = rollout.sample(engine, prompts, K, T, seed=5, step=3)
  assert not np.array_equal(other.tokens, r.tokens)


def test_greedy_rollouts_repeat_within_a_group(setup):
  engine, prompts = setup
  r = rollout.sample(engine, prompts, K, T, temperature=0.0)
  for i in range(len(prompts)):
    assert len({tuple(row) for row in r.tokens[i * K:(i + 1) * K].tolist()}) == 1
  assert np.all(r.sampler_logp[r.mask == 0] == 0)
