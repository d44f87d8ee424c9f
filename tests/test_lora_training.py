"""Training with LoRA adapters: only the adapters train and are checkpointed, on a sharded
mesh, with every remat policy and dropout (resuming: tests/test_lora_resume.py).

References: full fine-tuning's own loop (the same Trainer, losses equal across
accumulation and resume to the bit) and the base model (its weights unchanged).
"""


import jax
import numpy as np
import pytest

from train_utils import (
  lora_config,
  make_trainer,
  read_metrics,
  synthetic_features,
)


def test_only_adapters_train_sharded_like_their_weights(tmp_path):
  config = lora_config(num_steps=30, global_batch=8, micro_batch=8, save_every=1000)
  config.optimizer.update(schedule="constant", lr=1e-2, warmup_steps=0)
  features = synthetic_features(8, repeat_of=8)
  trainer = make_trainer(config, tmp_path, features)
  base_before = jax.device_get(trainer.parts.base)
  params = trainer.state.params
  names = ["/".join(str(k.key) for k in path) for path, _ in
           jax.tree_util.tree_leaves_with_path(params)]
  assert names and all("_lora/" in n for n in names), names
  # Optimizer moments exist for the adapters only.
  moments = sum(x.size for x in jax.tree.leaves(trainer.state.opt_state) if x.ndim)
  assert moments == 2 * sum(x.size for x in jax.tree.leaves(params))
  q = params["layers"]["attn"]["q_lora"]
  assert q["lora_a"].sharding.spec == jax.P(None, "fsdp", None)
  assert q["lora_b"].sharding.spec == jax.P(None, None, "tensor", None)
  result = trainer.run()
  trainer.close()
  metrics = read_metrics(tmp_path)
  assert result.last_metrics["loss"] < metrics[1]["loss"] - 0.5  # the adapters learn
  base_after = jax.device_get(trainer.parts.base)
  for a, b in zip(jax.tree.leaves(base_before), jax.tree.leaves(base_after)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("remat", ["full", "save_dots"])
def test_remat_policies_give_the_same_step(tmp_path, remat):
  features = synthetic_features(16)
  losses = {}
  for policy in ("none", remat):
    config = lora_config(num_steps=3, global_batch=8, micro_batch=8, save_every=1000)
    config.model.remat_policy = policy
    trainer = make_trainer(config, tmp_path / policy, features)
    trainer.run()
    trainer.close()
    losses[policy] = [read_metrics(tmp_path / policy)[s]["loss"] for s in (1, 2)]
  np.testing.assert_allclose(losses[remat], losses["none"], rtol=1e-6)

def test_dropout_masks_differ_by_layer_and_target_and_only_train_steps_use_them():
  import jax.numpy as jnp
  from flax import nnx

  from helpsteer_jax.models import lora
  cfg = lora.LoraConfig(rank=2, alpha=2.0, dropout=0.5)
  q = lora.Adapter((8,), ("embed",), (8,), ("embed",), cfg, rngs=nnx.Rngs(0), salt=0)
  k = lora.Adapter((8,), ("embed",), (8,), ("embed",), cfg, rngs=nnx.Rngs(0), salt=1)
  for a in (q, k):
    a.lora_b[...] = jnp.ones_like(a.lora_b[...])
  x = jnp.ones((4, 8))
  plain = q(x)
  with lora.dropout_key(jax.random.key(0)):
    with lora.layer_index(0):
      layer0, other_target = q(x), k(x)
    with lora.layer_index(1):
      layer1 = q(x)
  assert not np.array_equal(layer0, plain) and not np.array_equal(layer0, layer1)
  assert not np.array_equal(layer0, other_target)
  np.testing.assert_array_equal(q(x), plain)  # outside a training step: no dropout


def test_dropout_in_training_is_reproducible_under_remat(tmp_path):
  features = synthetic_features(16)
  losses = {}
  for dropout, remat in ((0.0, "none"), (0.3, "none"), (0.3, "save_dots_no_batch")):
    config = lora_config(num_steps=3, global_batch=8, micro_batch=4, save_every=1000)
    config.model.lora.dropout = dropout
    config.model.remat_policy = remat
    workdir = tmp_path / f"{dropout}_{remat}"
    trainer = make_trainer(config, workdir, features)
    trainer.run()
    trainer.close()
    losses[dropout, remat] = [read_metrics(workdir)[s]["loss"] for s in (1, 2, 3)]
  plain, dropped = losses[0.0, "none"], losses[0.3, "none"]
  assert dropped[0] == pytest.approx(plain[0], rel=1e-6)  # B = 0 at step 1: no effect yet
  assert dropped[2] != pytest.approx(plain[2], rel=1e-4)
  # The same masks whatever is rematerialised.
  np.testing.assert_allclose(losses[0.3, "save_dots_no_batch"], dropped, rtol=1e-5)
