"""The reference model's per-segment log-probs, computed once and cached on disk.

Preference losses need log ref(response) for every pair. Precomputing them
in a first pass (the reference is the initial policy) means the reference
model is not in memory while training. The pass writes one `.npy` part per
batch to the cache directory, so an interrupted pass resumes where it
stopped, and a manifest with a fingerprint of the model source and the
tokenized data, so a stale cache is recomputed rather than used.

Several processes: each puts only its devices' rows of every batch (sharded
over the mesh, `frozen_pass.FrozenPass`); process 0 alone checks the cache,
decides which parts are missing (broadcast, so every process runs the same
batches) and writes them.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
from typing import Sequence

import numpy as np
from absl import logging
from jax.sharding import NamedSharding

from helpsteer_jax import frozen_pass, multihost, processes, runtime
from helpsteer_jax import sharding as sharding_lib
from helpsteer_jax.data.batches import REFERENCE_INPUT
from helpsteer_jax.losses.pair_logprobs import model_segment_logps
from helpsteer_jax.train import state as state_lib


def fingerprint(features: Sequence[dict[str, np.ndarray]], model_source: str) -> str:
  """Hash of the model source description and the tokenized pairs."""
  h = hashlib.sha256(model_source.encode())
  for f in features:
    for key in ("inputs", "token_segments"):
      h.update(np.ascontiguousarray(f[key]).tobytes())
  return h.hexdigest()[:32]


def _part(cache: pathlib.Path, start: int) -> pathlib.Path:
  return cache / f"part_{start:08d}.npy"


def _prepare(cache: pathlib.Path, manifest: dict, starts: Sequence[int]) -> list[int]:
  """Clears a stale cache and writes the manifest; returns the batches still to compute."""
  path = cache / "manifest.json"
  if path.exists() and json.loads(path.read_text()) != manifest:
    logging.warning("reference cache %s was made for other data or another model;"
                    " recomputing it", cache)
    shutil.rmtree(cache)
  cache.mkdir(parents=True, exist_ok=True)
  if not path.exists():
    path.write_text(json.dumps(manifest, indent=2))
  return [s for s in starts if not _part(cache, s).exists()]


def reference_logps(parts: state_lib.ModelParts, features: Sequence[dict[str, np.ndarray]],
                    rt: runtime.Runtime, rows: int, cache_dir: str | pathlib.Path,
                    model_source: str, chunk_size: int = 256, vocab_chunk: int = 0) -> np.ndarray:
  """[num_pairs, 2, S] reference per-segment log-prob sums (cached, resumable)."""
  cache = pathlib.Path(cache_dir)
  n = len(features)
  manifest = {"fingerprint": fingerprint(features, model_source), "pairs": n, "rows": rows}
  sharding_lib.check_batch(rows, rt.mesh, rt.rules, "reference.batch")
  starts = list(range(0, n, rows))
  # Process 0 alone looks at the cache (it writes the parts): one list for all.
  todo = multihost.on_primary(lambda: _prepare(cache, manifest, starts))
  sharding = NamedSharding(rt.mesh, sharding_lib.logical_to_spec(("batch",), rt.rules))

  def forward(params, base, batch):
    with sharding_lib.axis_rules(rt.rules):
      return model_segment_logps(state_lib.merge_model(parts, params, base), batch, chunk_size,
                                 vocab_chunk)

  step = frozen_pass.FrozenPass(forward, rt.mesh, sharding, rows,
                    (parts.param_shardings, parts.base_shardings))
  if todo:
    logging.info("reference pass: %d of %d batches to compute into %s", len(todo),
                 len(starts), cache)
  local = 0
  for start in todo:
    chunk = features[start:start + rows]
    local += sharding_lib.local_row_count(sharding, rows, len(chunk))
    batch = {k: np.stack([f[k] for f in chunk]) for k in REFERENCE_INPUT.names}
    out = step.fetch([step.dispatch((parts.params, parts.base), batch)])
    if processes.is_primary():
      part = _part(cache, start)
      np.save(part.with_suffix(".tmp.npy"), out)
      part.with_suffix(".tmp.npy").replace(part)
  multihost.report_split(f"reference pass {cache.name}: pairs computed", local)
  runtime.sync("reference_cache_done")
  return np.concatenate([np.load(_part(cache, s)) for s in starts])
