"""Process environment for fast CPU runs.

XLA on CPU allocates its large temporaries with malloc on every step; glibc
serves them from fresh `mmap`s, so each step page-faults its activations in
4 KiB at a time (measured: half the time of a softmax over 200 MB). Asking
glibc to back those mappings with transparent huge pages removes nearly all
of the faults. The tunable is read at process start, so the entry points
re-execute themselves once with it set. Harmless on accelerator hosts.

glibc keeps what a process frees inside its heaps for reuse and returns only
the free tail of the main heap to the system. Compiling (LLVM) allocates and
frees gigabytes in many small pieces, so a process that compiles many programs
(a server's warm-up) keeps most of that freed memory resident. `trim` hands the
free pages of every heap back (`malloc_trim(0)`); `trim_after_compiles` does
so after each XLA compile, which keeps the peak near what is live.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from typing import Any

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


@functools.cache
def _malloc_trim():
  """glibc's `malloc_trim`, or None (another C library, another system)."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return libc.malloc_trim
  except (OSError, AttributeError):
    return None


def trim() -> bool:
  """Returns the free memory of every malloc heap to the system; whether any was."""
  fn = _malloc_trim()
  return bool(fn(0)) if fn is not None else False


_trimming = False


def trim_after_compiles() -> None:
  """`trim` after every XLA compile of this process from now on (once per process; JAX's
  monitoring listeners cannot be removed). A no-op without glibc."""
  global _trimming
  if _trimming or _malloc_trim() is None:
    return
  import jax

  from helpsteer_jax.compile_cache import COMPILE_EVENT

  def on_compile(event: str, duration: float, **kwargs: Any) -> None:
    if event == COMPILE_EVENT:
      trim()

  jax.monitoring.register_event_duration_secs_listener(on_compile)
  _trimming = True
