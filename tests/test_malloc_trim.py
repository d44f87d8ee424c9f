"""`cpu_env.trim` and `trim_after_compiles`: freed heap memory goes back to the system.

In a fresh process (glibc's defaults, no THP tunable): 300 MB malloc'ed in 64 KiB
pieces (below glibc's mmap threshold: from the heap), written, then all freed
but the last piece, which pins the heap's top so that glibc's own trimming
of the top cannot return them. The resident size stays up until `trim`, or
until a JAX compile once `trim_after_compiles` is on.
"""

import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

SCRIPT = r"""
import ctypes, sys
from helpsteer_jax import cpu_env

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def rss_mb():
  for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"):
      return int(line.split()[1]) / 1024

def fragment():
  pieces = [libc.malloc(64 << 10) for _ in range(4800)]
  for p in pieces:
    ctypes.memset(p, 1, 64 << 10)
  for p in pieces[:-1]:
    libc.free(p)
  return pieces[-1]

how = sys.argv[1]
if how == "compile":
  import jax, jax.numpy as jnp
  jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()  # JAX's own start-up first
  cpu_env.trim_after_compiles()
  cpu_env.trim_after_compiles()  # once per process
pinned = fragment()
before = rss_mb()
if how == "trim":
  assert cpu_env.trim()
elif how == "compile":
  jax.jit(lambda x: x * 3 - 1)(jnp.ones(5)).block_until_ready()
after = rss_mb()
print(f"{before:.0f} {after:.0f}")
"""


def _run(how: str) -> tuple[float, float]:
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MALLOC_ARENA_MAX")}
  env["JAX_PLATFORMS"] = "cpu"
  out = subprocess.run([sys.executable, "-c", SCRIPT, how], cwd=REPO_ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  before, after = map(float, out.stdout.split()[-2:])
  return before, after


@pytest.mark.parametrize("how", ["trim", "compile"])
def test_freed_heap_memory_goes_back_to_the_system(how):
  before, after = _run(how)
  assert before - after > 250, (before, after)


def test_without_a_trim_glibc_keeps_it():
  before, after = _run("nothing")
  assert abs(before - after) < 20, (before, after)
