"""Loss functions: fused log-probs, SFT, regression, Bradley-Terry, DPO / 2D-DPO.

The model-facing losses (`sft_loss`, `regression_loss`, `bt_loss`,
`preference_loss`) take `(model, batch)` and read the batch through its
schema in `data.batches`; each returns the summed loss and summed metrics
with `weight`, the normaliser the training loop divides by.
"""

from helpsteer_jax.losses.bt import BT_VARIANTS, bt_loss
from helpsteer_jax.losses.dpo import dpo_sigmoid_loss, ipo_loss
from helpsteer_jax.losses.dpo2d import LOSS_TYPES, PairInputs, PreferenceLossConfig, pair_losses
from helpsteer_jax.losses.logprobs import (
    segment_logprob_sums,
    token_logprobs,
    token_logprobs_vocab_chunked,
    weighted_nll,
)
from helpsteer_jax.losses.pair_logprobs import model_segment_logps, preference_loss
from helpsteer_jax.losses.regression import masked_mse, regression_loss
from helpsteer_jax.losses.sft import sft_loss

__all__ = [
    "BT_VARIANTS", "LOSS_TYPES", "PairInputs", "PreferenceLossConfig", "bt_loss",
    "dpo_sigmoid_loss", "ipo_loss", "masked_mse", "model_segment_logps", "pair_losses",
    "preference_loss", "regression_loss", "segment_logprob_sums", "sft_loss", "token_logprobs",
    "token_logprobs_vocab_chunked", "weighted_nll",
]
