"""The losses and the optimizer update carry named scopes in the lowered train step."""

import pytest
from test_aot_tasks import tiny

from helpsteer_jax import runtime
from helpsteer_jax.tasks import acsft, attribute_model, dpo2d

pytestmark = pytest.mark.version_tier

CASES = {
    "acsft": (acsft, {}, ("sft_loss", "fused_nll", "fused_nll_bwd")),
    "regression": (attribute_model, {}, ("regression_loss",)),
    "regular_bt": (attribute_model, {"loss": "regular_bt", "data.packing": False},
                   ("bt_loss",)),
    "dpo2d": (dpo2d, {}, ("preference_loss", "segment_logprob_sums", "fused_logprobs",
                          "fused_logprobs_bwd", "dpo2d_pair_losses")),
    "dpo_vocab_chunks": (dpo2d, {"loss.loss_type": "dpo", "loss.vocab_chunk_size": 64},
                         ("fused_logprobs", "fused_logprobs_bwd", "dpo_sigmoid_loss")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lowered_step_names_its_loss_and_optimizer_scopes(case):
  task, overrides, scopes = CASES[case]
  config = tiny(task.__name__.rsplit(".", 1)[1], **overrides)
  text = task.abstract_train_step(config, runtime.setup(config)).lower().as_text(
      debug_info=True)
  for scope in scopes + ("optimizer_update",):
    assert f"{scope}/" in text or f"{scope})/" in text, scope
