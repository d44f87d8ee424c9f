"""Several processes of the command-line entry point joined by `jax.distributed`.

Each process is a real `python -m helpsteer_jax.main` subprocess with its own
CPU devices (gloo collectives between them), so faults are injected with real
signals.
"""

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time

from conftest import REPO_ROOT, xla_flags


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@dataclasses.dataclass
class Result:
  returncode: int
  stdout: str
  stderr: str
  seconds: float


class Group:
  """`n` processes of one job, `devices` CPU devices each.

  Each runs `python -m module` (the entry point unless told otherwise) with
  `args` and the `--config.distributed.*` flags.
  """

  def __init__(self, *args: str, n: int = 2, devices: int = 4, port: int | None = None,
               distributed: list[tuple[str, ...]] | None = None, env: dict | None = None,
               heartbeat_timeout: int = 30, initialization_timeout: int = 120,
               module: str = "helpsteer_jax.main"):
    self.port = port or free_port()
    full_env = dict(os.environ, JAX_PLATFORMS="cpu",
                    XLA_FLAGS=xla_flags(devices))
    full_env.update(env or {})
    self.logs = []  # temporary files, so full pipes never block a process
    self.procs = []
    self.start = time.monotonic()
    for i in range(n):
      flags = distributed[i] if distributed is not None else (
          f"--config.distributed.coordinator_address=localhost:{self.port}",
          f"--config.distributed.num_processes={n}", f"--config.distributed.process_id={i}",
          f"--config.distributed.heartbeat_timeout={heartbeat_timeout}",
          f"--config.distributed.initialization_timeout={initialization_timeout}")
      log_out = _TempLog()
      log_err = _TempLog()
      self.logs.append((log_out, log_err))
      self.procs.append(subprocess.Popen(
          [sys.executable, "-m", module, *args, *flags],
          cwd=REPO_ROOT, env=full_env, stdout=log_out.file, stderr=log_err.file, text=True))

  def stderr(self, i: int) -> str:
    return self.logs[i][1].read()

  def stdout(self, i: int) -> str:
    return self.logs[i][0].read()

  def wait_for(self, i: int, text: str, timeout: float = 300, stream: str = "stderr") -> None:
    """Waits until process i has printed `text`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if text in (self.stderr(i) if stream == "stderr" else self.stdout(i)):
        return
      if self.procs[i].poll() is not None:
        raise AssertionError(f"process {i} exited ({self.procs[i].returncode}) before"
                             f" printing {text!r}:\n{self.stderr(i)[-4000:]}")
      time.sleep(0.2)
    self.kill()
    raise AssertionError(f"process {i} did not print {text!r} within {timeout} s:\n"
                         f"{self.stderr(i)[-4000:]}")

  def signal(self, i: int, sig: int = signal.SIGTERM) -> None:
    self.procs[i].send_signal(sig)

  def wait(self, timeout: float = 600) -> list[Result]:
    results = []
    for i, p in enumerate(self.procs):
      try:
        p.wait(timeout=max(1.0, timeout - (time.monotonic() - self.start)))
      except subprocess.TimeoutExpired:
        self.kill()
        raise AssertionError(f"process {i} still running after {timeout} s:\n"
                             f"{self.stderr(i)[-4000:]}") from None
      results.append(Result(p.returncode, self.stdout(i), self.stderr(i),
                            time.monotonic() - self.start))
    for out, err in self.logs:
      out.close()
      err.close()
    return results

  def kill(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        p.kill()


class _TempLog:
  """A process's output in a temporary file; its text stays readable after `close`."""

  def __init__(self):
    import tempfile
    self.file = tempfile.TemporaryFile("w+")
    self.text: str | None = None

  def read(self) -> str:
    if self.text is not None:
      return self.text
    self.file.flush()
    self.file.seek(0)
    return self.file.read()

  def close(self) -> None:
    self.text = self.read()
    self.file.close()


def run_group(*args: str, n: int = 2, timeout: float = 600, check: bool = True,
              **kwargs) -> list[Result]:
  """Runs `n` processes to the end; with `check`, every one must exit 0."""
  results = Group(*args, n=n, **kwargs).wait(timeout)
  if check:
    for i, r in enumerate(results):
      assert r.returncode == 0, f"process {i}: exit {r.returncode}\n{r.stderr[-4000:]}"
  return results
