"""The shared training loop: learning, accumulation, exact resume, resharding."""

import jax
import numpy as np
import pytest

from train_utils import (
  full_and_resumed,
  make_trainer,
  read_metrics,
  synthetic_features,
  tiny_config,
)


def test_loss_falls_on_a_repeated_batch(tmp_path):
  config = tiny_config(num_steps=40, global_batch=8, micro_batch=8, save_every=1000)
  config.optimizer.update(schedule="constant", lr=1e-2, warmup_steps=0)
  features = synthetic_features(8, repeat_of=8)
  trainer = make_trainer(config, tmp_path, features)
  result = trainer.run()
  trainer.close()
  metrics = read_metrics(tmp_path)
  assert metrics[1]["loss"] > 6.0          # ~log(vocab) at the start
  assert result.last_metrics["loss"] < 1.0  # memorised
  assert result.status == "finished"
  for key in ("learning_rate", "grad_norm", "tokens_per_s", "step_time", "mfu", "fill"):
    assert key in metrics[40]
  assert (tmp_path / "tensorboard").is_dir()


@pytest.mark.version_tier
def test_gradient_accumulation_does_not_change_the_step(tmp_path):
  features = synthetic_features(32)
  losses = {}
  for micro in (16, 8, 4):
    config = tiny_config(num_steps=3, global_batch=16, micro_batch=micro, save_every=1000)
    trainer = make_trainer(config, tmp_path / f"m{micro}", features)
    trainer.run()
    trainer.close()
    losses[micro] = [read_metrics(tmp_path / f"m{micro}")[s]["loss"] for s in (1, 2, 3)]
  np.testing.assert_allclose(losses[8], losses[16], rtol=1e-5)
  np.testing.assert_allclose(losses[4], losses[16], rtol=1e-5)


@pytest.mark.version_tier
def test_interrupted_run_resumes_with_identical_losses(tmp_path):
  features = synthetic_features(64)
  a, b = full_and_resumed(tiny_config, features, tmp_path)
  for step in (4, 5, 6):
    assert a[step]["loss"] == b[step]["loss"], (step, a[step]["loss"], b[step]["loss"])
    assert a[step]["grad_norm"] == b[step]["grad_norm"]


@pytest.mark.version_tier
def test_a_run_restarted_at_its_final_step_reports_the_logged_loss(tmp_path):
  features = synthetic_features(32)
  config = tiny_config(num_steps=3, save_every=1000)
  trainer = make_trainer(config, tmp_path, features)
  finished = trainer.run()
  trainer.close()
  again = make_trainer(tiny_config(num_steps=3, save_every=1000), tmp_path, features)
  result = again.run()  # nothing left to train
  again.close()
  assert result.step == 3 and result.status == "finished"
  assert result.last_metrics["loss"] == finished.last_metrics["loss"]
  assert result.last_metrics["grad_norm"] == finished.last_metrics["grad_norm"]


@pytest.mark.version_tier
def test_restore_onto_a_different_mesh(tmp_path):
  features = synthetic_features(32)
  config = tiny_config(mesh=(2, 2, 2), num_steps=4, save_every=2)
  trainer = make_trainer(config, tmp_path, features)
  trainer.run(stop_at=2)
  saved = jax.device_get(trainer.state.params)
  trainer.close()
  reshaped = make_trainer(tiny_config(mesh=(1, 8, 1), num_steps=4, micro_batch=8), tmp_path,
                          features)
  assert int(reshaped.state.step) == 2
  q = reshaped.state.params["layers"]["attn"]["q_proj"]
  assert q.sharding.spec == jax.P(None, "fsdp", "tensor", None)
  assert dict(q.sharding.mesh.shape) == {"data": 1, "fsdp": 8, "tensor": 1}
  for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(jax.device_get(reshaped.state.params))):
    np.testing.assert_array_equal(a, b)
  assert reshaped.run().status == "finished"
  reshaped.close()
