"""The one batched fixed-weights pass: batches, zero-row padding, outputs on the host."""

import jax
import numpy as np
from flax import nnx

from helpsteer_jax import frozen_pass, sharding
from helpsteer_jax.models import builder, catalog
from helpsteer_jax.rl import objective


def test_batched_pass_equals_one_forward_over_all_rows():
  model = builder.create(catalog.model_config("tiny", initializer_range=0.1), seed=0)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  rng = np.random.default_rng(0)
  b, length, t = 5, 24, 6
  inputs = rng.integers(1, 200, (b, length)).astype(np.int32)
  rows = {"inputs": inputs, "targets": np.roll(inputs, -1, 1),
          "positions": np.broadcast_to(np.arange(length, dtype=np.int32), (b, length)).copy(),
          "segment_ids": np.ones((b, length), np.int32),
          "at": np.broadcast_to(np.arange(10, 10 + t, dtype=np.int32), (b, t)).copy()}
  graphdef, state = nnx.split(model)

  def fn(s, batch):
    lp = objective.completion_logprobs(nnx.merge(graphdef, s), batch, 8)
    return {"lp": lp, "sum": lp.sum(-1)}

  whole = jax.device_get(jax.jit(fn)(state, rows))
  layout = jax.sharding.NamedSharding(mesh, sharding.batch_spec(sharding.DEFAULT_RULES))
  frozen = frozen_pass.FrozenPass(fn, mesh, layout, 2)  # 2 + 2 + 1 padded with a zero row
  pending = frozen.batches((state,), rows)
  assert [n for n, _ in pending] == [2, 2, 1]
  got = frozen_pass.FrozenPass.fetch(pending)
  assert got["lp"].shape == (b, t) and got["sum"].shape == (b,)
  # The code before (one jit per micro-batch of the same shapes, concatenated).
  jitted = jax.jit(fn)
  before = [jax.device_get(jitted(state, {k: v[lo:lo + 2] for k, v in rows.items()}))
            for lo in (0, 2)]
  last = jax.device_get(jitted(state, frozen_pass.padded({k: v[4:] for k, v in rows.items()}, 2)))
  np.testing.assert_allclose(
      got["lp"], np.concatenate([x["lp"] for x in before] + [last["lp"][:1]]), atol=1e-6, rtol=0)
  # One forward over all rows: other shapes, other float reduction orders (XLA:CPU blocks
  # a matmul by its shapes and the CPU's vector width), so a tolerance.
  np.testing.assert_allclose(got["lp"], whole["lp"], rtol=1e-5, atol=0)
  np.testing.assert_allclose(got["sum"], whole["sum"], rtol=1e-5, atol=0)
  again = frozen((state,), rows)
  np.testing.assert_array_equal(again["lp"], got["lp"])
  assert frozen_pass.padded({"x": np.ones((1, 3))}, 4)["x"].tolist()[1:] == [[0.0] * 3] * 3
