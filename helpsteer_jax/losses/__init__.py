"""Loss functions: fused log-probs, SFT, regression, Bradley-Terry, DPO / 2D-DPO.

The model-facing losses (`sft_loss`, `regression_loss`, `bt_loss`,
`preference_loss`) take `(model, batch)` and read the batch through its
schema in `data.batches`; each returns the summed loss and summed metrics
with `weight`, the normaliser the training loop divides by.
"""
