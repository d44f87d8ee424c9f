"""The one seed rule and the one sample-and-score path (RL rollouts and best-of-n).

Models are tiny and random; the tokenizer is the demo BPE tokenizer.
"""

import jax
import numpy as np
import pytest

from helpsteer_jax import sharding
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.inference import best_of_n, generator, sample_score, steering
from helpsteer_jax.inference.sampling import SamplingConfig, sample_seed
from helpsteer_jax.models import builder, catalog, hf
from helpsteer_jax.rl import rollout
from helpsteer_jax.scoring import rewards as rewards_lib


def test_sample_seed_is_rls_rule_distinct_per_index_and_stable():
  # RL's rule before it became the shared one: its values (and the RL demo) are unchanged.
  assert sample_seed(5, 2, 1, 0) == int(
      np.random.SeedSequence([5, 2, 1, 0]).generate_state(1)[0])
  seeds = [sample_seed(7, i, j) for i in range(20) for j in range(4)]
  assert len(set(seeds)) == len(seeds)
  assert seeds == [sample_seed(7, i, j) for i in range(20) for j in range(4)]
  assert all(0 <= s < 2**32 for s in seeds)
  assert sample_seed(7, 1) != sample_seed(8, 0) != sample_seed(8, 1)
  assert 0 <= sample_seed(-3, 1) < 2**32 and sample_seed(-3, 1) != sample_seed(3, 1)


class LengthScorer:
  def __call__(self, convs):
    out = np.zeros((len(convs), len(ATTRIBUTES)), np.float32)
    for i, c in enumerate(convs):
      out[i, ATTRIBUTES.index("helpfulness")] = len(c.turns[-1].text) % 7
    return out


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
  tok = hf.load_tokenizer(demo_tokenizer.build_demo_tokenizer(tmp_path_factory.mktemp("tok")))
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  return generator.Generator(generator.make_engine(model, mesh, tok, max_batch=4,
                                                   max_length=64, stop_strings=()))


def test_rollouts_and_best_of_n_sample_through_the_shared_path(gen):
  requests = [steering.make_request(p, {"verbosity": 2})
              for p in ("Name two fruits.", "What is 2 plus 3?")]
  ids = [r.prompt_ids(gen.tokenizer) for r in requests]
  hot = SamplingConfig(temperature=1.0)
  # RL: rollout.sample is the shared sampler with the keys (seed, step, prompt).
  r = rollout.sample(gen.engine, ids, 3, 8, seed=5, step=2)
  shared = sample_score.sample(gen.engine, ids, 3, 8, hot, [(5, 2, i) for i in range(2)])
  for b, out in enumerate(shared):
    assert r.tokens[b, :len(out.token_ids)].tolist() == out.token_ids
  scorer = LengthScorer()
  rolled, preds, extra = rollout.sample_and_score(
      gen.engine, [rollout.Prompt(q, p) for q, p in zip(requests, ids)], 3, 8, scorer,
      seed=5, step=2, on_sampled=lambda x: x.tokens.sum())
  np.testing.assert_array_equal(rolled.tokens, r.tokens)
  assert extra == r.tokens.sum()
  scored = sample_score.sample_and_score(gen.engine, ids, requests, 3, 8, hot,
                                         [(5, 2, i) for i in range(2)], scorer)
  np.testing.assert_array_equal(preds, scored.predictions)
  # Best-of-n: the same path with the keys (seed + request,).
  weights = rewards_lib.weight_vector({"helpfulness": 1.0})
  results = best_of_n.best_of_n(gen, requests, 3, scorer, weights, 8, hot, seed=3)
  scored = sample_score.sample_and_score(gen.engine, ids, requests, 3, 8, hot,
                                         [(3 + i,) for i in range(2)], scorer)
  assert [c.response for res in results for c in res.candidates] == scored.responses
  assert [c.scores["helpfulness"] for res in results for c in res.candidates] == \
      scored.predictions[:, ATTRIBUTES.index("helpfulness")].tolist()
  # A request's samples depend on its seed key alone, not on the batch.
  alone = best_of_n.best_of_n(gen, requests[1:], 3, scorer, weights, 8, hot, seed=4)
  assert [c.response for c in alone[0].candidates] == \
      [c.response for c in results[1].candidates]
