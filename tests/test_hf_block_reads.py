"""Block reads of HF checkpoints: each parameter block from only the bytes
it needs, bitwise what converting the whole tensor gives."""

import itertools

import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from helpsteer_jax import sharding
from helpsteer_jax.models import catalog, hf
from helpsteer_jax.models import safetensors_io as st

pytestmark = pytest.mark.version_tier

CFG = catalog.model_config("tiny", attention_bias=True, tie_word_embeddings=False)


def _blocks(shape):
  """Indices of every axis cut at 0, 1 and the middle, in all combinations."""
  cuts = [[slice(None), slice(1, None), slice(0, max(1, n // 2)),
           slice(n // 2, n - 1 if n > 2 else n)] for n in shape]
  return list(itertools.product(*cuts))


def test_mapping_reads_bounding_block():
  """Reference: the whole HF tensor converted with `to_ours`, then indexed.
  Blocks that split a head's head_dim or a run of heads read whole heads."""
  rng = np.random.RandomState(0)
  for m in hf.param_mappings(CFG):
    x = rng.randn(*m.hf_shape).astype(np.float32)
    np.testing.assert_array_equal(m.to_hf(m.to_ours(x)), x)
    for index in _blocks(m.shape):
      read = []

      def get(hf_index):
        read.append(x[hf_index].size)
        return x[hf_index]

      np.testing.assert_array_equal(m.read(get, index), m.to_ours(x)[index],
                                    err_msg=f"{m.hf_name} {index}")
      # The bounding block: the outer axis of each group as asked, its inner
      # axes (head_dim of a run of heads) whole.
      outer = [index[sum(map(len, m.axes[:j]))] for j in range(len(m.axes))]
      whole = [len(range(*sl.indices(g[0]))) * int(np.prod(g[1:]))
               for sl, g in zip(outer, m.axes)]
      assert read == [int(np.prod(whole))], (m.hf_name, index)


def _write_checkpoint(directory, cfg) -> dict[str, np.ndarray]:
  rng = np.random.RandomState(1)
  arrays = {name: rng.randn(*m.hf_shape).astype(ml_dtypes.bfloat16)
            for m in hf.param_mappings(cfg)
            for name in ([m.hf_name.format(i=i) for i in range(cfg.num_layers)]
                         if m.layered else [m.hf_name])}
  plans = [st.TensorPlan(n, a.shape, a.dtype) for n, a in arrays.items()]
  st.write_file(directory / st.SINGLE_FILE, plans, lambda p: arrays[p.name])
  return arrays


@pytest.mark.parametrize("mesh_shape", [(2, 2, 2), (1, 8, 1)])
def test_sharded_import_is_bitwise_and_reads_each_byte_once(tmp_path, mesh_shape):
  """One process holds every device: it reads each tensor exactly once
  (replicas over `data` share a block) and every parameter equals the
  whole-tensor conversion (reference: `to_ours` of the full bf16 tensor,
  cast to fp32)."""
  arrays = _write_checkpoint(tmp_path, CFG)
  reader = st.CheckpointReader(tmp_path)
  mesh = sharding.make_mesh(mesh_shape)
  _, state = hf.load_hf_state(tmp_path, CFG, mesh, reader=reader)
  assert reader.bytes_by_tensor == {n: a.nbytes for n, a in arrays.items()}
  assert reader.bytes_read == sum(a.nbytes for a in arrays.values())
  params = {path: v.get_value() for path, v in nnx.to_flat_state(state)}
  for m in hf.param_mappings(CFG):
    got = np.asarray(params[m.path])
    names = [m.hf_name.format(i=i) for i in range(CFG.num_layers)] if m.layered else [m.hf_name]
    want = np.stack([m.to_ours(arrays[n]).astype(np.float32) for n in names])
    np.testing.assert_array_equal(got, want if m.layered else want[0], err_msg=m.hf_name)


def test_reader_blocks_and_errors(tmp_path):
  """The reader serves blocks of bf16 tensors and counts their bytes; a
  truncated file is named in a SafetensorsError."""
  a = np.arange(24, dtype=np.float32).reshape(4, 6).astype(ml_dtypes.bfloat16)
  plans = [st.TensorPlan("a", a.shape, a.dtype), st.TensorPlan("e", (0, 3), np.float32)]
  arrays = {"a": a, "e": np.zeros((0, 3), np.float32)}
  st.write_file(tmp_path / st.SINGLE_FILE, plans, lambda p: arrays[p.name])
  reader = st.CheckpointReader(tmp_path)
  block = reader.get("a", (slice(1, 3), slice(2, 5)))
  assert block.dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(block, a[1:3, 2:5])
  assert reader.get("e", (slice(0, 0),)).shape == (0, 3)
  np.testing.assert_array_equal(reader.get("a"), a)
  assert reader.bytes_read == 6 * 2 + a.nbytes and reader.bytes_by_tensor["a"] == 60
  path = tmp_path / st.SINGLE_FILE
  path.write_bytes(path.read_bytes()[:-4])
  with pytest.raises(st.SafetensorsError, match=str(path)):
    st.CheckpointReader(tmp_path)
