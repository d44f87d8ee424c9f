"""Artifacts several test files read, built once per test run.

`pytest -n 2 --dist loadfile` runs two worker processes. The first one to ask for an
artifact builds it in the run's shared temporary directory while holding a file lock;
the other waits for the lock and reads the finished directory. A build that fails leaves
no `.complete` mark, so the next one to ask builds it again (and fails the same way).
"""

import hashlib
import json
import os
import pathlib
import shutil
from collections.abc import Callable

import filelock
import pytest

COMPLETE = ".complete"


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  """The directory every process of this run sees: the workers' common parent under xdist."""
  base = tmp_path_factory.getbasetemp()
  root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
  root.mkdir(exist_ok=True)
  return root


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[pathlib.Path], None], **key) -> pathlib.Path:
  """The directory `build(out)` fills, built by the first process of the run that asks.

  `key` (JSON values: the settings the build reads) is part of the directory's name, so
  two builds of one `name` with other settings do not share a directory.
  """
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
  root = shared_root(tmp_path_factory)
  out = root / f"{name}-{digest}"
  with filelock.FileLock(str(root / f"{out.name}.lock")):
    if not (out / COMPLETE).exists():
      shutil.rmtree(out, ignore_errors=True)
      out.mkdir()
      build(out)
      (out / COMPLETE).touch()
  return out
