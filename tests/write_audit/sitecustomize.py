"""Records the files a test subprocess writes (used by tests/task_groups.py).

Put this directory on PYTHONPATH and set HELPSTEER_WRITE_AUDIT to a directory:
the process appends to `<dir>/<pid>.log` the absolute path of every file it
opens for writing, truncates, renames or removes (Python audit events), so a
test can tell which process of a group wrote what.
"""

import os
import sys

_DIR = os.environ.get("HELPSTEER_WRITE_AUDIT")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def _path(value) -> str | None:
  if isinstance(value, int):
    return None
  try:
    return os.path.abspath(os.fsdecode(value))
  except (TypeError, ValueError):
    return None


def _install(directory: str) -> None:
  log = os.open(os.path.join(directory, f"{os.getpid()}.log"),
                os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

  def record(*paths) -> None:
    for p in map(_path, paths):
      if p is not None:
        os.write(log, (p + "\n").encode("utf-8", "surrogateescape"))

  def hook(event: str, args: tuple) -> None:
    if event == "open":
      path, mode, flags = args
      if (mode and any(c in mode for c in "wax+")) or (flags or 0) & _WRITE_FLAGS:
        record(path)
    elif event == "os.rename":
      record(args[0], args[1])
    elif event in ("os.remove", "os.truncate", "shutil.rmtree"):
      record(args[0])

  sys.addaudithook(hook)


if _DIR:
  _install(_DIR)
