"""Mesh construction, logical-axis rules, validation and sharded init."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from helpsteer_jax import sharding
from helpsteer_jax.models import builder, catalog

pytestmark = pytest.mark.version_tier


def test_eight_fake_devices():
  assert jax.device_count() == 8


@pytest.mark.parametrize("shape,expected", [
    ((1, -1, 1), (1, 8, 1)), ((2, 2, 2), (2, 2, 2)), ((-1, 1, 2), (4, 1, 2)),
])
def test_mesh_resolves_minus_one(shape, expected):
  mesh = sharding.make_mesh(shape)
  assert tuple(mesh.shape.values()) == expected
  assert mesh.axis_names == sharding.MESH_AXES
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


@pytest.mark.parametrize("shape,message", [
    ((2, 2, 1), "uses 4 devices but 8 are available"),
    ((3, -1, 1), "not divisible by the fixed axes' product 3"),
    ((-1, -1, 1), "at most one axis may be -1"),
    ((1, 8), "must have 3 entries"),
])
def test_mesh_errors_say_what_to_change(shape, message):
  with pytest.raises(sharding.ShardingConfigError, match=message):
    sharding.make_mesh(shape)


def test_logical_to_spec_uses_each_mesh_axis_once():
  rules = sharding.DEFAULT_RULES
  assert sharding.logical_to_spec(("embed", "mlp"), rules) == P("fsdp", "tensor")
  # Activations: batch takes data+fsdp, so embed falls back to replicated.
  assert (sharding.logical_to_spec(("batch", "length", "embed"), rules)
          == P(("data", "fsdp"), None, None))
  assert (sharding.logical_to_spec(("layers", "embed", "heads", "head_dim"), rules)
          == P(None, "fsdp", "tensor", None))


def test_rules_fall_through_to_next_candidate():
  rules = (("batch", "data"), ("embed", "data"), ("embed", "fsdp"))
  assert sharding.logical_to_spec(("batch", "embed"), rules) == P("data", "fsdp")


def test_bad_rule_names_mesh_axis():
  with pytest.raises(sharding.ShardingConfigError, match="mesh axes are"):
    sharding.normalize_rules([["batch", ["data", "pipeline"]]])


@pytest.mark.parametrize("mesh_shape,field,value,message", [
    ((1, 2, 4), "num_kv_heads", 2,
     r"kv_heads=2 is not divisible by mesh axes 'tensor' \(4 shards\)"),
    ((1, 1, 8), "num_heads", 12, r"heads=12 is not divisible"),
    ((1, 4, 2), "intermediate_size", 175, r"mlp=175 is not divisible"),
])
def test_model_that_cannot_shard_fails_before_compiling(mesh_shape, field, value, message):
  kwargs = {field: value}
  if field == "num_heads":
    kwargs["num_kv_heads"] = 4
    kwargs["head_dim"] = 16
  cfg = catalog.model_config("tiny", **kwargs)
  mesh = sharding.make_mesh(mesh_shape)
  with pytest.raises(sharding.ShardingConfigError, match=message) as info:
    builder.validate_model_on_mesh(cfg, mesh, sharding.DEFAULT_RULES)
  assert "mesh.fsdp" in str(info.value)


def test_batch_not_divisible_by_batch_shards():
  mesh = sharding.make_mesh((2, 2, 2))
  with pytest.raises(sharding.ShardingConfigError,
                     match="batch size 6 is not divisible by the 4 batch shards"):
    sharding.check_batch(6, mesh, sharding.DEFAULT_RULES)
  sharding.check_batch(8, mesh, sharding.DEFAULT_RULES)


@pytest.mark.parametrize("mesh_shape", [(2, 2, 2), (1, 8, 1), (8, 1, 1)])
def test_parameters_are_born_sharded(mesh_shape):
  cfg = catalog.model_config("tiny", num_heads=8, num_kv_heads=8, head_dim=8, hidden_size=64)
  mesh = sharding.make_mesh(mesh_shape)
  model = builder.init_model(cfg, mesh, sharding.DEFAULT_RULES, seed=0)
  params = builder.named_variables(nnx.state(model, nnx.Param))
  fsdp, tensor = mesh.shape["fsdp"], mesh.shape["tensor"]
  q = params["layers/attn/q_proj"][...]
  assert q.sharding.spec == P(None, "fsdp", "tensor", None)
  # Each device holds only its shard of a parameter.
  shard_shape = q.addressable_shards[0].data.shape
  assert shard_shape == (cfg.num_layers, cfg.hidden_size // fsdp, cfg.num_heads // tensor,
                         cfg.head_dim)
  assert params["embed"][...].sharding.spec == P("tensor", "fsdp")
  assert params["lm_head"][...].sharding.spec == P("fsdp", "tensor")
  assert params["layers/mlp/down_proj"][...].sharding.spec == P(None, "tensor", "fsdp")


def test_sharded_init_equals_single_device_init():
  cfg = catalog.model_config("tiny")
  one = builder.init_model(cfg, sharding.make_mesh((1, 1, 1), jax.devices()[:1]),
                           sharding.DEFAULT_RULES)
  many = builder.init_model(cfg, sharding.make_mesh((2, 2, 2)), sharding.DEFAULT_RULES)
  a = builder.named_variables(nnx.state(one, nnx.Param))
  b = builder.named_variables(nnx.state(many, nnx.Param))
  for name in a:
    np.testing.assert_array_equal(np.asarray(a[name][...]), np.asarray(b[name][...]), err_msg=name)
