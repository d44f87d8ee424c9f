"""Annotation and the reference-log-prob pass, SIGKILLed mid-way in a real process,
resume without duplicated or missing rows."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np

from conftest import REPO_ROOT

TESTS = REPO_ROOT / "tests"


def _spawn(code: str) -> subprocess.Popen:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(TESTS)]))
  return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=TESTS, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 300) -> None:
  deadline = time.time() + timeout
  while not ready() and time.time() < deadline and proc.poll() is None:
    time.sleep(0.05)
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  proc.kill()
  proc.communicate(timeout=60)


def _lines(path):
  return path.read_bytes().count(b"\n") if path.exists() else 0


def test_annotation_killed_mid_way_resumes_without_duplicates_or_gaps(tmp_path):
  from test_annotate import FakeScorer, convs, rm

  from helpsteer_jax.tasks import annotate
  data = convs(40)
  full = tmp_path / "full.jsonl"
  annotate.annotate(data, rm(FakeScorer()), full, chunk_rows=2, slots=[4, 8])
  part = tmp_path / "part.jsonl"
  proc = _spawn(f"""
      import pathlib, time
      from helpsteer_jax.tasks import annotate
      from test_annotate import FakeScorer, convs, rm

      class Slow(FakeScorer):
        def score(self, seqs, on_batch=None):
          time.sleep(0.2)
          return super().score(seqs, on_batch)

      annotate.annotate(convs(40), rm(Slow()), pathlib.Path({str(part)!r}), chunk_rows=2,
                        slots=[4, 8])
      """)
  _kill_when(proc, lambda: _lines(part) >= 6)
  written = _lines(part)
  assert 6 <= written < 40
  counts = annotate.annotate(data, rm(FakeScorer()), part, chunk_rows=2, slots=[4, 8])
  assert counts["already_written"] + counts["written"] == 40
  assert part.read_text() == full.read_text()


_REFERENCE_SETUP = """
    import numpy as np
    from helpsteer_jax import runtime
    from helpsteer_jax.data.batches import REFERENCE_INPUT
    from helpsteer_jax.train import reference
    from helpsteer_jax.train import state as state_lib
    from test_dpo2d_task import _config

    def features(n=24):
      out = []
      for i in range(n):
        f = REFERENCE_INPUT.zeros_example(length=32, segments=4)
        f["seg_mask"][:] = 1
        f["inputs"][:] = np.arange(32) % (i + 5) + 3
        f["segment_ids"][:] = 1
        f["token_segments"][:, 4:20] = 1 + (np.arange(16) % 3)
        out.append(f)
      return out

    config = _config()
    rt = runtime.setup(config)
    parts = state_lib.split_model(runtime.build_model(config, rt), rt.mesh, rt.rules)
"""


def test_reference_pass_killed_mid_way_resumes_without_duplicates_or_gaps(tmp_path):
  cache = tmp_path / "killed"
  proc = _spawn(_REFERENCE_SETUP + f"""
    import time
    save = np.save
    def slow_save(*args, **kwargs):  # widen the window between parts
      save(*args, **kwargs)
      time.sleep(0.5)
    np.save = slow_save
    reference.reference_logps(parts, features(), rt, 4, {str(cache)!r}, "model", 0)
    """)
  _kill_when(proc, lambda: len(list(cache.glob("part_????????.npy"))) >= 2)
  done = sorted(p.name for p in cache.glob("part_????????.npy"))
  assert 2 <= len(done) < 6

  namespace = {}
  exec(textwrap.dedent(_REFERENCE_SETUP), namespace)
  reference, feats = namespace["reference"], namespace["features"]()
  args = (namespace["parts"], feats, namespace["rt"], 4)
  resumed = reference.reference_logps(*args, cache, "model", 0)
  fresh = reference.reference_logps(*args, tmp_path / "fresh", "model", 0)
  assert resumed.shape == (24, 2, 4)
  np.testing.assert_array_equal(resumed, fresh)
  assert len(list(cache.glob("part_????????.npy"))) == 6
