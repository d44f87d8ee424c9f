"""One process of tests/test_multihost_hf.py: import a HF checkpoint, run a
forward, export it again; once per mesh shape, so that one process group checks
several meshes.

  python -m hf_multihost_worker --config.hf_path=DIR --config.out=DIR \
      --config.meshes="1,8,1;1,4,2" [--config.export=False] [--config.distributed.*=...]

Each mesh (data,fsdp,tensor) spans every process; mesh i writes under `<out>/mesh_<i>`
(`run`'s files), and the first mesh's import is exported unless `export` is off.
`run` writes `<out>/hf_read_<process>.json` (bytes read per HF tensor, the process of
each mesh position, the size of every array the export gathered to the host) and, on
process 0, `<out>/logits.npy` of a fixed batch. Each process passes its own
`<out>/export_<process>` to `save_hf_model`, so a write by any process but 0 would show.
"""

from __future__ import annotations

import functools
import json
import pathlib
import sys

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from helpsteer_jax import sharding
from helpsteer_jax.models import hf
from helpsteer_jax.models import safetensors_io as st

EXPORT_SHARD_BYTES = 100_000  # several files, and so an index


def forward_logits(model, mesh) -> np.ndarray:
  """Logits of a fixed batch, replicated to every process."""
  tokens = np.random.RandomState(0).randint(0, model.cfg.vocab_size, (8, 16)).astype(np.int32)
  replicated = NamedSharding(mesh, PartitionSpec())
  graphdef, state = nnx.split(model)

  @functools.partial(jax.jit, out_shardings=replicated)
  def logits(state, tokens):
    m = nnx.merge(graphdef, state)
    return m.logits(m(tokens))

  with jax.set_mesh(mesh), sharding.axis_rules(sharding.DEFAULT_RULES):
    out = logits(state, jax.make_array_from_callback(tokens.shape, replicated,
                                                     lambda i: tokens[i]))
  return np.asarray(out.addressable_data(0))


def run(hf_path: str, out: str, mesh_shape: tuple[int, int, int], export: bool) -> None:
  out_dir = pathlib.Path(out)
  pid = jax.process_index()
  mesh = sharding.make_mesh(mesh_shape)
  reader = st.CheckpointReader(hf_path)
  model = nnx.merge(*hf.load_hf_state(hf_path, hf.config_from_hf(hf_path), mesh,
                                      reader=reader))
  logits = forward_logits(model, mesh)
  gathered: list[int] = []
  if export:
    fetch = hf._fetch  # record what each gather puts on the host

    def recording_fetch(x):
      host = fetch(x)
      gathered.append(host.nbytes)
      return host

    hf._fetch = recording_fetch
    try:
      hf.save_hf_model(model, out_dir / f"export_{pid}", dtype="float32",
                       max_shard_bytes=EXPORT_SHARD_BYTES)
    finally:
      hf._fetch = fetch
  out_dir.mkdir(parents=True, exist_ok=True)
  report = {"read": dict(reader.bytes_by_tensor), "bytes_read": reader.bytes_read,
            "processes": [d.process_index for d in mesh.devices.flat],
            "gathered": gathered}
  (out_dir / f"hf_read_{pid}.json").write_text(json.dumps(report))
  if pid == 0:
    np.save(out_dir / "logits.npy", logits)


def mesh_shapes(meshes: str) -> list[tuple[int, int, int]]:
  """"1,8,1;1,4,2" as [(1, 8, 1), (1, 4, 2)] (data, fsdp, tensor)."""
  return [tuple(int(n) for n in shape.split(",")) for shape in meshes.split(";")]


def main(argv: list[str]) -> None:
  del argv
  from helpsteer_jax import distributed
  config = _CONFIG.value
  distributed.initialize(config.distributed)
  for i, mesh_shape in enumerate(mesh_shapes(config.meshes)):
    run(config.hf_path, f"{config.out}/mesh_{i}", mesh_shape, config.export and i == 0)
  distributed.finish()


if __name__ == "__main__":
  from absl import app
  from ml_collections import config_flags

  from helpsteer_jax import config_base

  _CONFIG = config_flags.DEFINE_config_dict("config", ml_collections.ConfigDict(dict(
      hf_path="", out="", export=True, meshes="1,8,1",
      distributed=config_base.distributed_config())))
  app.run(main, argv=sys.argv)
