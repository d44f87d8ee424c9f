"""Running the command-line entry point in a subprocess."""

import os
import subprocess
import sys

from conftest import REPO_ROOT, xla_flags

# A tiny AC-SFT model and short run: compile once, a handful of steps.
TINY_RUN = ("--config.model.hidden_size=64", "--config.model.intermediate_size=128",
            "--config.model.num_layers=2", "--config.train.seq_len=128",
            "--config.train.global_batch=8", "--config.train.micro_batch=8",
            "--config.train.loss_chunk_size=64", "--config.train.log_every=1",
            "--config.train.eval_every=0", "--config.train.eval_batches=2",
            "--config.optimizer.warmup_steps=1")


def run_main(*args: str, devices: int = 8, timeout: float = 600, env: dict | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
  """`python -m helpsteer_jax.main ARGS` from the repository root."""
  full_env = dict(os.environ)
  full_env.update({
      "JAX_PLATFORMS": "cpu",
      "XLA_FLAGS": xla_flags(devices),
  })
  full_env.update(env or {})
  proc = subprocess.run([sys.executable, "-m", "helpsteer_jax.main", *args],
                        cwd=REPO_ROOT, env=full_env, capture_output=True, text=True,
                        timeout=timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\n"
                         f"stderr:\n{proc.stderr[-4000:]}")
  return proc
