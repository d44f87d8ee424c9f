"""Process environment for fast CPU runs.

XLA on CPU allocates its large temporaries with malloc on every step; glibc
serves them from fresh `mmap`s, so each step page-faults its activations in
4 KiB at a time (measured: half the time of a softmax over 200 MB). Asking
glibc to back those mappings with transparent huge pages removes nearly all
of the faults. The tunable is read at process start, so the entry points
re-execute themselves once with it set. Harmless on accelerator hosts.
"""

from __future__ import annotations

import os
import sys

_TUNABLE = "glibc.malloc.hugetlb=1"
_OPT_OUT = "HELPSTEER_JAX_NO_REEXEC"


def reexec_with_malloc_tunables(argv: list[str] | None = None) -> None:
  """Re-executes the current Python command with THP-backed malloc (Linux)."""
  if not sys.platform.startswith("linux") or os.environ.get(_OPT_OUT):
    return
  current = os.environ.get("GLIBC_TUNABLES", "")
  if "glibc.malloc.hugetlb" in current:
    return
  env = dict(os.environ)
  env["GLIBC_TUNABLES"] = f"{current}:{_TUNABLE}" if current else _TUNABLE
  env[_OPT_OUT] = "1"  # never loop, even if glibc ignores the tunable
  args = argv if argv is not None else [sys.executable] + sys.orig_argv[1:]
  os.execve(sys.executable, args, env)
