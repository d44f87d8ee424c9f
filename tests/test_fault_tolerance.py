"""Faults inside the training engine: damaged checkpoints and non-finite updates."""

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpsteer_jax import runtime
from helpsteer_jax.errors import ConfigError, TrainingError
from helpsteer_jax.losses.sft import sft_loss
from helpsteer_jax.train import loop
from helpsteer_jax.train import state as state_lib

from train_utils import make_trainer, read_metrics, synthetic_features, tiny_config

POISON = 2  # synthetic features draw tokens from 3 up, so only poisoned rows hold it


def _largest_file(directory):
  return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("damage", [pytest.param("truncate", marks=pytest.mark.version_tier),
                                    "remove"])
def test_damaged_latest_checkpoint_falls_back_to_the_previous(tmp_path, damage, caplog):
  features = synthetic_features(32)
  config = tiny_config(num_steps=4, save_every=2, async_checkpoint=False)
  trainer = make_trainer(config, tmp_path, features)
  trainer.run()
  trainer.close()
  full = read_metrics(tmp_path)
  latest = tmp_path / "checkpoints" / "4"
  if damage == "truncate":
    victim = _largest_file(latest / "state")
    os.truncate(victim, victim.stat().st_size // 3)
  else:
    (latest / "state" / "_METADATA").unlink()

  with caplog.at_level(logging.WARNING):
    resumed = make_trainer(config, tmp_path, features)
  assert int(resumed.state.step) == 2
  assert any("skipping step 4" in r.getMessage() for r in caplog.records)
  assert (tmp_path / "corrupt_checkpoints" / "4").is_dir()
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]
  assert resumed.run().status == "finished"
  resumed.close()
  again = read_metrics(tmp_path)  # steps 3 and 4 are recomputed identically
  for step in (3, 4):
    assert again[step]["loss"] == full[step]["loss"]
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4"]


@pytest.mark.version_tier
def test_checkpoint_of_another_model_is_a_config_error_not_skipped(tmp_path):
  features = synthetic_features(16)
  trainer = make_trainer(tiny_config(num_steps=3, save_every=2), tmp_path, features)
  trainer.run()
  trainer.close()
  other = tiny_config(num_steps=3, save_every=2)
  other.model.num_layers = 3
  with pytest.raises(ConfigError, match="another config"):
    make_trainer(other, tmp_path, features)
  assert (tmp_path / "checkpoints" / "2").is_dir()  # left alone


def _poisoned_trainer(config, workdir, features, through_gradients):
  """An SFT trainer whose loss is NaN on any micro-batch holding the POISON token.

  `through_gradients`: NaN reaches the gradients (loss * NaN); otherwise only the
  loss value is NaN (jnp.where: zero gradient), which the step must catch too.
  """
  rt = runtime.setup(config)
  parts = state_lib.split_model(runtime.build_model(config, rt), rt.mesh, rt.rules)

  def loss_fn(model, batch):
    total, aux = sft_loss(model, batch, chunk_size=config.train.loss_chunk_size)
    bad = jnp.any(batch["inputs"] == POISON)
    if through_gradients:
      return total * jnp.where(bad, jnp.nan, 1.0), aux
    return jnp.where(bad, jnp.nan, total), aux

  return loop.Trainer(config, workdir, rt, parts, loss_fn, features)


def _poison(features, every):
  out = []
  for i, f in enumerate(features):
    f = dict(f)
    if i % every == 0:
      f["inputs"] = f["inputs"].copy()
      f["inputs"][0] = POISON
    out.append(f)
  return out


@pytest.mark.version_tier
def test_nonfinite_updates_are_skipped_and_counted(tmp_path):
  features = _poison(synthetic_features(64), every=9)
  config = tiny_config(num_steps=6, micro_batch=8, max_consecutive_nonfinite=6)
  trainer = _poisoned_trainer(config, tmp_path, features, through_gradients=True)
  result = trainer.run()
  trainer.close()
  assert result.status == "finished"
  metrics = read_metrics(tmp_path)
  skipped = [s for s in range(1, 7) if not np.isfinite(metrics[s]["loss"])]
  assert 0 < len(skipped) < 6, skipped
  assert metrics[6]["nonfinite_total"] == len(skipped)
  for s in range(1, 7):  # the consecutive count resets on every good step
    want = (metrics[s - 1]["nonfinite_run"] + 1 if s > 1 else 1) if s in skipped else 0
    assert metrics[s]["nonfinite_run"] == want
  for leaf in jax.tree.leaves(jax.device_get(trainer.state.params)):
    assert np.isfinite(leaf).all()


def test_a_run_of_nonfinite_losses_aborts_naming_steps_and_batches(tmp_path):
  features = _poison(synthetic_features(16), every=1)
  config = tiny_config(num_steps=6, micro_batch=8, max_consecutive_nonfinite=3, save_every=100)
  trainer = _poisoned_trainer(config, tmp_path, features, through_gradients=False)
  before = jax.device_get(trainer.state.params)
  with pytest.raises(TrainingError, match=r"3 consecutive steps \(1\.\.3, global batches 0\.\.2"):
    trainer.run()
  trainer.close()
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(trainer.state.params))):
    np.testing.assert_array_equal(a, b)  # no update was applied


@pytest.mark.version_tier
def test_a_disk_too_full_for_a_checkpoint_fails_before_compiling(tmp_path, monkeypatch):
  import collections
  import shutil
  usage = collections.namedtuple("usage", "total used free")
  monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 4096, 4096))
  monkeypatch.setattr(loop.Trainer, "_compile", lambda self: pytest.fail("compiled"))
  with pytest.raises(ConfigError, match=r"MiB free but one checkpoint of the train state needs"):
    make_trainer(tiny_config(), tmp_path, synthetic_features(16))
