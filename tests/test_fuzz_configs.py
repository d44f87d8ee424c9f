"""Config fuzzing: invalid mesh / model / batch / sequence settings fail before compiling.

Random combinations go through the checks every training task runs before it
builds a step (mesh construction, model shape validation, sharding of every
parameter, batch and loss-chunk divisibility). The test decides validity on
its own from the rules of the default sharding table and asserts that an
invalid combination raises `ConfigError` with a message naming what to
change, and that a valid one passes. No model is built and nothing compiles.
"""

import math

import jax
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpsteer_jax import config_base, config_sections, runtime
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.models import builder
from helpsteer_jax.train import loop

SIZES = st.sampled_from([1, 2, 3, 4, 8])


@st.composite
def settings_(draw):
  return dict(
      data=draw(st.sampled_from([1, 2, 4, -1])), fsdp=draw(st.sampled_from([1, 2, 4, 8, -1])),
      tensor=draw(SIZES), num_heads=draw(st.sampled_from([2, 3, 4, 6, 8])),
      kv_heads=draw(st.sampled_from([1, 2, 3, 4])), hidden=draw(st.sampled_from([48, 64, 96])),
      mlp=draw(st.sampled_from([96, 128, 192])), vocab=draw(st.sampled_from([256, 257, 512])),
      global_batch=draw(st.sampled_from([2, 4, 6, 8, 16])),
      micro_batch=draw(st.sampled_from([1, 2, 4, 8])),
      seq_len=draw(st.sampled_from([64, 96, 128])), chunk=draw(st.sampled_from([0, 32, 64, 128])))


def _expected_problem(s, devices: int) -> str | None:
  """Why the combination cannot run (the default rules: batch -> data x fsdp,
  embed -> fsdp, heads / kv_heads / mlp / vocab -> tensor), or None."""
  shape = [s["data"], s["fsdp"], s["tensor"]]
  if shape.count(-1) > 1:
    return "mesh"
  known = math.prod(x for x in shape if x != -1)
  if -1 in shape:
    if devices % known:
      return "mesh"
    shape[shape.index(-1)] = devices // known
  if math.prod(shape) != devices:
    return "mesh"
  data, fsdp, tensor = shape
  if s["num_heads"] % s["kv_heads"]:
    return "model"
  for size in (s["num_heads"], s["kv_heads"], s["mlp"], s["vocab"]):
    if size % tensor:
      return "sharding"
  if s["hidden"] % fsdp:
    return "sharding"
  if s["global_batch"] % s["micro_batch"] or s["micro_batch"] % (data * fsdp):
    return "batch"
  if s["chunk"] and s["seq_len"] > s["chunk"] and s["seq_len"] % s["chunk"]:
    return "chunk"
  return None


def _check(s) -> None:
  config = config_base.base_config("acsft")
  config.mesh = config_base.mesh_config(s["data"], s["fsdp"], s["tensor"])
  config.model = config_base.model_section(
      "tiny", hidden_size=s["hidden"], intermediate_size=s["mlp"], num_layers=2,
      num_heads=s["num_heads"], num_kv_heads=s["kv_heads"], head_dim=16,
      vocab_size=s["vocab"])
  tc = config_sections.train_config(global_batch=s["global_batch"], micro_batch=s["micro_batch"],
                         seq_len=s["seq_len"], loss_chunk_size=s["chunk"])
  rt = runtime.setup(config)
  model_cfg = runtime.model_config(config)
  builder.validate_model_on_mesh(model_cfg, rt.mesh, rt.rules)
  loop.check_batch_config(tc, rt)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(settings_())
def test_invalid_combinations_fail_before_compiling(s):
  problem = _expected_problem(s, jax.device_count())
  try:
    _check(s)
  except ConfigError as e:
    assert problem is not None, f"valid settings {s} were refused: {e}"
    message = str(e)
    assert any(word in message for word in ("mesh", "divisible", "multiple", "num_heads")), message
    return
  assert problem is None, f"settings {s} should fail ({problem}) but passed every check"
