"""Inference: KV-cache decoding, sampling, steering, best-of-n, the serving engine, and the
model to generate with (an HF directory or a training run's checkpoint)."""
