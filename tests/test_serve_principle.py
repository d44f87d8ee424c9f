"""/v1/rewards with a principle judge (RLBFF) as the server's scorer: the served rewards
equal the local scorer's (`scoring.load.load_scorer` in this process, the same config
section) on the same conversations, the judge reasoning first as configured; so do
OpenRLHF's `/get_reward` rewards of the rendered conversations, at the configured weights.

The judge is the serve tests' tiny random policy (a causal LM with the demo tokenizer),
served by a server of its own (one CPU device) whose scorer section names it; warmed up,
it compiles nothing while the judge reasons and scores.
"""

import httpx
import ml_collections
import numpy as np

from helpsteer_jax import config_base, runtime, sharding
from helpsteer_jax.config_sections import HELPSTEER2_WEIGHTS, scorer_section
from helpsteer_jax.data import template
from helpsteer_jax.data.records import ATTRIBUTES
from helpsteer_jax.scoring.load import load_scorer
from helpsteer_jax.scoring.scorer import REWARD_SLOT
from helpsteer_jax.serve import protocol

from serve_utils import KEY, SCORER_MAX_LEN, Server

PRINCIPLE = "The response answers the question."
STEPS = 6  # the judge's reasoning budget


def test_rewards_of_a_principle_judge_equal_the_local_scorer(served_models, tmp_path):
  judge = served_models / "policy"
  server = Server(served_models, tmp_path, "--config.scorer.judge=principle",
                  f"--config.scorer.source={judge}", "--config.scorer.head=",
                  f"--config.scorer.principle={PRINCIPLE}",
                  f"--config.scorer.judge_max_new_tokens={STEPS}")
  try:
    items = [([{"role": "user", "content": "What is 2 plus 3?"}], "It is 5."),
             ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
               {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}],
              "Goodbye!")]
    body = {"items": [{"messages": m, "response": r} for m, r in items],
            "weights": {"helpfulness": 1.0}}
    response = server.post("rewards", body)
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    # OpenRLHF's /get_reward on the same conversations, rendered: the configured weighting
    # (HelpSteer2's) of the judge's reward in the helpfulness column.
    texts = [template.regression_text(c) for c in _convs(items)]
    openrlhf = httpx.post(f"{server.base}/get_reward", json={"query": texts}, timeout=300,
                          headers={"Authorization": f"Bearer {KEY}"}).json()
    assert server.stats()["compiles"] == server.warm_compiles
  finally:
    server.stop()
  got = np.asarray([[row["attributes"][n] for n in ATTRIBUTES] for row in data])
  section = scorer_section(source=str(judge), judge="principle", principle=PRINCIPLE,
                           judge_max_new_tokens=STEPS, max_len=SCORER_MAX_LEN,
                           model=config_base.model_section("tiny"))
  config = {"mesh": {"data": 2, "fsdp": 2, "tensor": 2},
            "sharding_rules": tuple(sharding.DEFAULT_RULES)}
  scorer = load_scorer(section, runtime.setup(ml_collections.ConfigDict(config)))
  want = scorer(_convs(items))
  slot = ATTRIBUTES.index(REWARD_SLOT)
  assert np.isfinite(want[:, slot]).all() and len(set(want[:, slot])) == 2
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
  np.testing.assert_allclose([row["reward"] for row in data], want[:, slot], rtol=0, atol=1e-4)
  np.testing.assert_allclose(openrlhf["rewards"],
                             HELPSTEER2_WEIGHTS[REWARD_SLOT] * want[:, slot], rtol=0, atol=1e-4)
  np.testing.assert_allclose(openrlhf["extra_logs"][REWARD_SLOT], want[:, slot], rtol=0,
                             atol=1e-4)


def _convs(items):
  return [protocol.scored_conversation([protocol.Message(**x) for x in m], r)
          for m, r in items]
