"""The dpo2d task: reference modes, the reference cache and AC-SFT initialisation."""

import json
import math
import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpsteer_jax import runtime
from helpsteer_jax.data.batches import REFERENCE_INPUT
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import hf
from helpsteer_jax.runs import preference
from helpsteer_jax.tasks import dpo2d as task
from helpsteer_jax.train import checkpoint as ckpt_lib
from helpsteer_jax.train import optim
from helpsteer_jax.train import state as state_lib

from conftest import REPO_ROOT


def _config(**loss):
  config = runpy.run_path(str(REPO_ROOT / "configs" / "dpo2d.py"))["get_config"]()
  config.model.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=2, attention_block_size=32)
  config.mesh.update(data=2, fsdp=2, tensor=2)
  config.data.update(demo_train_pairs=16, demo_validation_pairs=0, max_segments=4)
  config.train.update(num_steps=1, global_batch=8, micro_batch=8, seq_len=128, log_every=1,
                      save_every=1, export_hf=False, loss_chunk_size=64, async_checkpoint=False)
  config.optimizer.update(schedule="constant", warmup_steps=0)
  config.reference.batch = 4
  config.loss.update(loss)
  return config


def _first_step(workdir):
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return next(r for r in rows if r.get("step") == 1 and "loss" in r)


def test_on_the_fly_reference_equals_policy_at_the_start(tmp_path):
  """At step 1 the policy is the reference: every grouped term is log sigmoid(0)."""
  config = _config(loss_type="dpo2d", grouped=True)
  config.reference.mode = "on_the_fly"
  task.run(config, str(tmp_path))
  metrics = _first_step(tmp_path)
  rows = [json.loads(line)
          for line in (tmp_path / "demo_2d" / "train.jsonl").read_text().splitlines()]
  # Pairs are drawn at random, so check the loss lies in the range N log 2 spans.
  n = [min(len(r["chosen_segments"]), len(r["rejected_segments"])) for r in rows]
  assert min(n) * math.log(2) - 1e-4 <= metrics["loss"] <= max(n) * math.log(2) + 1e-4
  assert abs(metrics["reward_margin"]) < 1e-4 and metrics["accuracy_2d_grouped"] == 0.0
  assert not (tmp_path / "reference").exists()


def test_cached_reference_from_an_acsft_checkpoint(tmp_path):
  """A policy restored from a train-state checkpoint with zero weights predicts the
  uniform distribution, so the cached reference sums are -tokens * log(vocab)."""
  config = _config(loss_type="dpo")
  rt = runtime.setup(config)
  parts = state_lib.split_model(runtime.build_model(config, rt), rt.mesh, rt.rules)
  parts.params = jax.tree.map(jnp.zeros_like, parts.params)
  tx, _ = optim.make_optimizer(config.optimizer, 10)
  state, _ = state_lib.create_train_state(tx, parts, rt.mesh, 0)
  saver = ckpt_lib.Checkpointer(tmp_path / "acsft" / "checkpoints", 1, 1, async_save=False)
  import grain
  saver.save(3, state, iter(grain.MapDataset.source([1]).to_iter_dataset()), force=True)
  saver.close()

  config.init.source = str(tmp_path / "acsft")
  task.run(config, str(tmp_path / "run"))
  assert _first_step(tmp_path / "run")["loss"] == pytest.approx(math.log(2), abs=1e-5)
  parts_dir = tmp_path / "run" / "reference" / "train"
  ref = np.concatenate([np.load(p) for p in sorted(parts_dir.glob("part_*.npy"))])
  vocab = runtime.model_config(config).vocab_size
  features = preference.load_features(str(tmp_path / "run" / "demo_2d" / "train.jsonl"), config,
                                preference.loss_config(config, csv=False),
                                hf.load_tokenizer(tmp_path / "run" / "demo_tokenizer"))
  counts = np.stack([[np.bincount(f["token_segments"][j], minlength=5)[1:] for j in (0, 1)]
                     for f in features])
  np.testing.assert_allclose(ref, -counts * math.log(vocab), rtol=1e-5)


def test_reference_cache_is_reused_and_invalidated(tmp_path):
  from helpsteer_jax.train import reference
  config = _config()
  rt = runtime.setup(config)
  parts = state_lib.split_model(runtime.build_model(config, rt), rt.mesh, rt.rules)
  features = [REFERENCE_INPUT.zeros_example(length=32, segments=4) for _ in range(6)]
  for i, f in enumerate(features):
    f["seg_mask"][:] = 1
    f["inputs"][:] = i + 3
    f["segment_ids"][:] = 1
    f["token_segments"][:, :8] = 1
  out = reference.reference_logps(parts, features, rt, 4, tmp_path, "model-a", 0)
  assert out.shape == (6, 2, 4)
  (tmp_path / "part_00000004.npy").unlink()  # an interrupted pass: one part missing
  first = (tmp_path / "part_00000000.npy").stat().st_mtime_ns
  again = reference.reference_logps(parts, features, rt, 4, tmp_path, "model-a", 0)
  np.testing.assert_allclose(again, out, rtol=1e-6)
  assert (tmp_path / "part_00000000.npy").stat().st_mtime_ns == first  # not recomputed
  np.save(tmp_path / "part_00000000.npy", np.zeros((4, 2, 4), np.float32))
  fresh = reference.reference_logps(parts, features, rt, 4, tmp_path, "model-b", 0)
  np.testing.assert_allclose(fresh, out, rtol=1e-6)  # stale cache was recomputed


@pytest.mark.parametrize("change, message", [
    (dict(loss_type="nope"), "loss.loss_type"),
    (dict(beta=0.0), "loss.beta"),
    (dict(aspect_weights=(0.5, 0.5)), "5 loss.aspects"),
    (dict(aspect_weights=(0.5, 0.5, 0.5, 0.0, 0.0)), "sum to 1"),
])
def test_impossible_loss_configs_fail_early(change, message):
  config = _config(**change)
  with pytest.raises(ConfigError, match=message):
    preference.loss_config(config, csv=False)
  assert preference.loss_config(_config(aspect_weights=(0.5, 0.5)), csv=True).aspects == ("score",)
