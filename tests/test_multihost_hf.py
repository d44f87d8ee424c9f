"""HF checkpoint import and export from two processes (4 CPU devices each).

A tiny random Llama checkpoint (transformers' config, our export's writer), in
several safetensors files, is imported onto a mesh whose fsdp axis spans both
processes (`hf_multihost_worker.py`, launched by `multiprocess.Group`). The reference
is the same worker code run in this process on 8 devices: the same mesh
shape, one process. Each process must read only the blocks its devices hold
(the expected bytes are worked out here from the shardings), the logits
must match the 1-process import, and the export must be byte-identical to
the 1-process export with only process 0 writing.
"""

import json
import math
import os

import jax
import numpy as np
import pytest
import transformers
from flax import nnx

from helpsteer_jax import sharding
from helpsteer_jax.models import builder, hf
from helpsteer_jax.models import safetensors_io as st

import hf_multihost_worker as worker
from conftest import REPO_ROOT
from multiprocess import run_group

pytestmark = pytest.mark.multihost

P = jax.sharding.PartitionSpec


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
  cfg = transformers.LlamaConfig(
      hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
      initializer_range=0.2, tie_word_embeddings=False)
  path = tmp_path_factory.mktemp("llama")
  model = builder.create(hf.config_from_hf(cfg.to_dict()), seed=0)
  hf.save_hf_model(model, path, dtype="float32", max_shard_bytes=100_000)
  assert len(list(path.glob("*.safetensors"))) > 1
  return str(path)


# fsdp=8 (with the export); fsdp=4 x tensor=2, fsdp across the processes.
MESHES = ((1, 8, 1), (1, 4, 2))


@pytest.fixture(scope="module")
def two_processes(checkpoint, tmp_path_factory):
  """One two-process group importing `checkpoint` onto each of MESHES in turn (and
  exporting the first): mesh i's files are in `<returned>/mesh_<i>`."""
  out = tmp_path_factory.mktemp("multi")
  run_group(f"--config.hf_path={checkpoint}", f"--config.out={out}",
            f"--config.meshes={';'.join(','.join(map(str, m)) for m in MESHES)}",
            "--config.export=True", module="hf_multihost_worker", timeout=300,
            env={"PYTHONPATH": os.pathsep.join(
                [str(REPO_ROOT / "tests"), os.environ.get("PYTHONPATH", "")])})
  return out


def _reports(out) -> list[dict]:
  return [json.loads((out / f"hf_read_{p}.json").read_text()) for p in range(2)]


def _expected_reads(checkpoint, mesh_shape, processes) -> tuple[list[dict], dict]:
  """Per process and HF tensor, the bytes of the distinct blocks its devices
  hold (from the parameter shardings on a local mesh of the same shape whose
  positions belong to `processes`); and each tensor's size."""
  cfg = hf.config_from_hf(checkpoint)
  mesh = sharding.make_mesh(mesh_shape)
  owner = {d: processes[i] for i, d in enumerate(mesh.devices.flat)}
  _, abstract = builder.abstract_model(cfg)
  specs = {path: v.get_value() for path, v in
           nnx.to_flat_state(builder.state_specs(abstract, sharding.DEFAULT_RULES))}
  reader = st.CheckpointReader(checkpoint)
  expected = [{}, {}]
  sizes = {}
  for m in hf.param_mappings(cfg):
    spec = P(*specs[m.path][1:]) if m.layered else specs[m.path]
    indices = jax.sharding.NamedSharding(mesh, spec).devices_indices_map(m.shape)
    blocks = [set(), set()]
    for device, index in indices.items():
      blocks[owner[device]].add(tuple(s.indices(n)[:2] for s, n in zip(index, m.shape)))
    for i in range(cfg.num_layers if m.layered else 1):
      name = m.hf_name.format(i=i)
      itemsize = reader.info(name).dtype.itemsize
      sizes[name] = reader.info(name).nbytes
      for p in range(2):
        expected[p][name] = itemsize * sum(
            math.prod(stop - start for start, stop in b) for b in blocks[p])
  return expected, sizes


def _check_reads(reports, checkpoint, mesh_shape):
  expected, sizes = _expected_reads(checkpoint, mesh_shape, reports[0]["processes"])
  assert reports[1]["processes"] == reports[0]["processes"]
  assert set(reports[0]["processes"]) == {0, 1}
  for p in range(2):
    assert reports[p]["read"] == expected[p], f"process {p}"
  # DEFAULT_RULES shard every parameter (norm scales too) over fsdp, which
  # spans the processes: each reads half of every tensor, none twice.
  for name, size in sizes.items():
    assert [r["read"][name] for r in reports] == [size // 2] * 2, name
  total = sum(sizes.values())
  assert [r["bytes_read"] for r in reports] == [total // 2] * 2
  return total


def test_two_process_import_and_export(checkpoint, two_processes, tmp_path):
  """fsdp=8 over 2 processes: each reads half of every tensor (reference:
  the shardings); the logits equal bitwise those of a 1-process import of
  the same checkpoint on 8 devices (reference: this process); the export is
  byte-identical to that process's export, process 1 writes nothing, and
  each gather puts one tensor (one layer) on the host, never the model."""
  mesh_shape, multi = MESHES[0], two_processes / "mesh_0"
  reports = _reports(multi)
  total = _check_reads(reports, checkpoint, mesh_shape)

  ref = tmp_path / "single"
  worker.run(checkpoint, str(ref), mesh_shape, export=True)
  single = json.loads((ref / "hf_read_0.json").read_text())
  assert single["bytes_read"] == total  # one process: every tensor once
  np.testing.assert_array_equal(np.load(multi / "logits.npy"),
                                np.load(ref / "logits.npy"))

  multi_files = sorted(os.listdir(multi / "export_0"))
  assert multi_files == sorted(os.listdir(ref / "export_0"))
  assert st.INDEX_FILE in multi_files and "config.json" in multi_files
  assert "generation_config.json" in multi_files
  for name in multi_files:
    assert ((multi / "export_0" / name).read_bytes()
            == (ref / "export_0" / name).read_bytes()), name
  assert not (multi / "export_1").exists()
  # The export gathers one (layer of one) tensor at a time, each once.
  reader = st.CheckpointReader(checkpoint)
  largest = max(reader.info(n).nbytes for n in reader.names())
  for r in reports:
    assert len(r["gathered"]) == len(reader.names())
    assert max(r["gathered"]) == largest < total / 4


def test_two_process_import_fsdp_and_tensor(checkpoint, two_processes, tmp_path):
  """fsdp=4 x tensor=2, fsdp across the processes (the same process group, after the
  fsdp=8 import): each process reads half of every tensor, and the norm scales'
  blocks, which two of its devices (tensor=0, 1) hold, once (reference: the
  shardings); logits equal the 1-process import (reference: this process, 8 devices);
  no export."""
  mesh_shape, multi = MESHES[1], two_processes / "mesh_1"
  _check_reads(_reports(multi), checkpoint, mesh_shape)
  assert not list(multi.glob("export_*"))
  worker.run(checkpoint, str(tmp_path / "single"), mesh_shape, export=False)
  np.testing.assert_array_equal(np.load(multi / "logits.npy"),
                                np.load(tmp_path / "single" / "logits.npy"))
