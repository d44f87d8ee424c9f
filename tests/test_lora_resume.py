"""Resuming a LoRA run: accumulation and exact resume give full fine-tuning's losses to the
bit, and a run resumed on another base model is refused (the base fingerprint).
"""

import json

import numpy as np
import pytest

from helpsteer_jax.errors import ConfigError
from helpsteer_jax.train import base_fingerprint

from train_utils import (
  full_and_resumed,
  lora_config,
  make_trainer,
  read_metrics,
  synthetic_features,
)


def test_accumulation_and_exact_resume(tmp_path):
  features = synthetic_features(64)
  losses = {}
  for micro in (8, 4):
    config = lora_config(num_steps=3, global_batch=8, micro_batch=micro, save_every=1000)
    trainer = make_trainer(config, tmp_path / f"m{micro}", features)
    trainer.run()
    trainer.close()
    losses[micro] = [read_metrics(tmp_path / f"m{micro}")[s]["loss"] for s in (1, 2, 3)]
  np.testing.assert_allclose(losses[4], losses[8], rtol=1e-5)

  a, b = full_and_resumed(lora_config, features, tmp_path)
  for step in (4, 5, 6):
    assert a[step]["loss"] == b[step]["loss"], (step, a[step]["loss"], b[step]["loss"])


def test_resuming_on_another_base_is_refused(tmp_path):
  features = synthetic_features(32)
  trainer = make_trainer(lora_config(num_steps=4), tmp_path, features)
  trainer.run(stop_at=2)
  trainer.close()
  saved = json.loads((tmp_path / "checkpoints" / base_fingerprint.FILE).read_text())
  assert any(name.endswith("q_proj") for name in saved)
  other = lora_config(num_steps=4)
  other.seed = 1  # another random base
  with pytest.raises(ConfigError, match="other base weights"):
    make_trainer(other, tmp_path, features)
  # The same base on another mesh resumes.
  reshaped = make_trainer(lora_config(mesh=(1, 8, 1), num_steps=4, micro_batch=8), tmp_path,
                          features)
  assert int(reshaped.state.step) == 2
  reshaped.close()
