"""Running the command-line entry point in a subprocess."""

import os
import subprocess
import sys

from conftest import REPO_ROOT


def run_main(*args: str, devices: int = 8, timeout: float = 600, env: dict | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
  """`python -m helpsteer_jax.main ARGS` from the repository root."""
  full_env = dict(os.environ)
  full_env.update({
      "JAX_PLATFORMS": "cpu",
      "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"
                   " --xla_backend_optimization_level=0",
  })
  full_env.update(env or {})
  proc = subprocess.run([sys.executable, "-m", "helpsteer_jax.main", *args],
                        cwd=REPO_ROOT, env=full_env, capture_output=True, text=True,
                        timeout=timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\n"
                         f"stderr:\n{proc.stderr[-4000:]}")
  return proc
