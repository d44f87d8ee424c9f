"""Multi-process runs: `jax.distributed` from the config or the environment.

One process runs per host (TPU VM worker) or per GPU (SLURM task). Every
process executes the same program; they form one global mesh after
`initialize`. The config section `distributed`:

- `mode`: `auto` (initialise when a cluster is detected: a multi-host TPU VM,
  a SLURM job with several tasks, or an explicit coordinator), `always`
  or `never`.
- `coordinator_address` (`host:port`), `num_processes`, `process_id`:
  explicit values (e.g. two processes on one machine); empty / -1 lets JAX
  read them from the cluster (TPU metadata, SLURM variables).
- `local_device_ids`: the accelerators this process owns (default: all
  visible, or SLURM's `SLURM_LOCALID` GPU with one process per GPU).
- `initialization_timeout`: seconds to wait for every process to join.
- `heartbeat_timeout`: seconds after which a process that stopped sending
  heartbeats counts as lost; the others then exit (see `PeerWatchdog`).

A lost peer would otherwise leave the survivors blocked in their next
collective for ever (ICI and gloo collectives have no useful timeout). JAX's
coordination service notices the missing heartbeats; the job is marked
recoverable so that the service reports the loss instead of aborting every
process, and `PeerWatchdog` turns it into one line on stderr and exit status
`PEER_LOST_EXIT` (75, EX_TEMPFAIL: rerun all processes to resume from the
last checkpoint). If process 0, which hosts the coordination service, is the
one lost, JAX's runtime ends the others at once with its own message
("...the leader task was preempted/died...").
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any

import jax
import ml_collections
from absl import logging

from helpsteer_jax import processes
from helpsteer_jax.errors import ConfigError

MODES = ("auto", "always", "never")
PEER_LOST_EXIT = 75  # os.EX_TEMPFAIL: a transient failure, rerunning resumes
_KEY = "helpsteer_jax"


def cluster_detected(env: dict[str, str] | None = None) -> str:
  """The kind of multi-process environment this process runs in ("" = none)."""
  env = os.environ if env is None else env
  if env.get("JAX_COORDINATOR_ADDRESS"):
    return "explicit"
  if (int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1")) or 1) > 1
      and env.get("SLURM_JOB_ID")):
    return "slurm"
  if int(env.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
    return "mpi"
  hosts = env.get("TPU_WORKER_HOSTNAMES", "")
  if "," in hosts or env.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return "tpu"
  try:  # a TPU VM: JAX asks the metadata server for the workers
    from jax._src import clusters
    if clusters.GceTpuCluster.is_env_present() or clusters.GkeTpuCluster.is_env_present():
      return "tpu"
  except (ImportError, AttributeError):
    pass
  return ""


def _device_ids(value: str) -> list[int] | None:
  if not value:
    return None
  try:
    return [int(x) for x in str(value).split(",")]
  except ValueError:
    raise ConfigError(f"distributed.local_device_ids={value!r}: expected comma-separated"
                      " integers such as 0,1") from None


def _check_explicit(section: ml_collections.ConfigDict) -> None:
  if section.num_processes < 1 or section.process_id < 0:
    raise ConfigError("distributed.coordinator_address is set: also set"
                      " distributed.num_processes and distributed.process_id")
  if section.process_id >= section.num_processes:
    raise ConfigError(f"distributed.process_id={section.process_id} is out of range for"
                      f" distributed.num_processes={section.num_processes}: give each process"
                      f" a distinct id in 0..{section.num_processes - 1}")
  if ":" not in section.coordinator_address:
    raise ConfigError(f"distributed.coordinator_address={section.coordinator_address!r}: expected"
                      " host:port (process 0's host and a free port)")


def _client():
  from jax._src import distributed as jax_distributed
  return jax_distributed.global_state.client


def _join_message(section: ml_collections.ConfigDict, why: str) -> str:
  where = section.coordinator_address or "the detected coordinator"
  return (f"could not join the process group at {where} as process {section.process_id} of"
          f" {section.num_processes} within distributed.initialization_timeout="
          f"{section.initialization_timeout} s ({why}); check that distributed.coordinator_address"
          " is process 0's host:port, that process 0 is running, and that every process was"
          " started with the same distributed.num_processes and its own process_id")


class _JoinDeadline:
  """Ends the process with `_join_message` shortly before JAX's own join timeout.

  When joining fails (no coordinator, too few processes), JAX's runtime
  aborts the process from a thread of its own, with a stack trace and no
  hint of which setting is wrong; this says it in one line first.
  """

  def __init__(self, section: ml_collections.ConfigDict):
    timeout = float(section.initialization_timeout)
    self.seconds = timeout - min(2.0, timeout / 5)
    self.section = section
    self._done = threading.Event()

  def __enter__(self) -> "_JoinDeadline":
    threading.Thread(target=self._expire, name="helpsteer-join-deadline", daemon=True).start()
    return self

  def _expire(self) -> None:
    if not self._done.wait(self.seconds):
      _exit_with(_join_message(self.section, "not every process joined in time"), 2)

  def __exit__(self, *exc) -> None:
    self._done.set()


def _check_agreement(section: ml_collections.ConfigDict) -> None:
  """Every process must have been started with the same process count.

  Each process reports its count, and all read every report before any judges
  them: process 0 hosts the coordination service, so it waits until every other
  process has said that it read the reports (its last call to the service)
  before it may leave with the error. A barrier would not do: process 0 could
  pass it and exit before another's answer from the barrier reached it.
  """
  client = _client()
  pid, count = jax.process_index(), jax.process_count()
  mine = int(section.num_processes) if section.num_processes > 0 else count
  client.key_value_set(f"{_KEY}/num_processes/{pid}", str(mine))
  timeout_ms = int(section.initialization_timeout) * 1000
  try:
    client.wait_at_barrier(f"{_KEY}/num_processes_reported", timeout_ms)
    reported = {other: int(client.blocking_key_value_get(f"{_KEY}/num_processes/{other}",
                                                         timeout_ms))
                for other in range(count) if other != pid}
    if pid == 0:
      for other in range(1, count):
        client.blocking_key_value_get(f"{_KEY}/num_processes_read/{other}", timeout_ms)
    else:
      try:
        client.key_value_set(f"{_KEY}/num_processes_read/{pid}", "1")
      except Exception:  # noqa: BLE001 - process 0 may leave before answering; the reports are read
        pass
  except Exception as e:  # noqa: BLE001 - a timeout: some process never got this far
    raise ConfigError(f"not every process reported within distributed.initialization_timeout="
                      f"{section.initialization_timeout} s ({e}); this process group has {count}"
                      " processes: start every process with the same"
                      " distributed.num_processes") from None
  for other in range(count):
    theirs = count if other == pid else reported[other]  # the group's own count for itself
    if theirs != mine:
      who = "the process group has" if other == pid else f"process {other} was started with"
      raise ConfigError(f"this process (id {pid}) was started with distributed.num_processes="
                        f"{mine} but {who} {theirs}: start every process with the same"
                        " distributed.num_processes")


def initialize(section: ml_collections.ConfigDict | None) -> bool:
  """Joins the process group described by `section` (or the environment).

  Must run before anything touches a JAX backend. Returns whether this is a
  multi-process run. Idempotent. A process that cannot join (wrong address,
  mismatched process count, unreachable peers) fails with `ConfigError`
  after `initialization_timeout` seconds at most.
  """
  if section is None or section.mode == "never":
    return False
  if section.mode not in MODES:
    raise ConfigError(f"distributed.mode={section.mode!r}; choose one of {MODES}")
  if jax.distributed.is_initialized():
    return True
  explicit = bool(section.coordinator_address)
  kind = "explicit" if explicit else cluster_detected()
  if section.mode == "auto" and not kind:
    return False
  if int(section.heartbeat_timeout) < 1:
    raise ConfigError(f"distributed.heartbeat_timeout={section.heartbeat_timeout}: give a number"
                      " of seconds >= 1 (pods: 100 or more)")
  kwargs = dict(initialization_timeout=int(section.initialization_timeout),
                heartbeat_timeout_seconds=int(section.heartbeat_timeout))
  if explicit:
    _check_explicit(section)
    kwargs.update(coordinator_address=section.coordinator_address,
                  num_processes=int(section.num_processes), process_id=int(section.process_id))
  ids = _device_ids(section.local_device_ids)
  if ids is not None:
    kwargs["local_device_ids"] = ids
  # A lost process is reported by the service rather than aborting everyone,
  # so PeerWatchdog can say what happened (see the module docstring).
  jax.config.update("jax_enable_recoverability", True)
  with _JoinDeadline(section):
    try:
      jax.distributed.initialize(**kwargs)
    except (ValueError, TypeError) as e:
      raise ConfigError(f"distributed: {e}") from None
    except Exception as e:  # noqa: BLE001 - the runtime's errors (deadline, unavailable)
      why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
      raise ConfigError(_join_message(section, why)) from None
    _check_agreement(section)
  PeerWatchdog(int(section.heartbeat_timeout)).start()
  logging.info("process %d of %d (%s cluster), %d local / %d global devices",
               jax.process_index(), jax.process_count(), kind or "configured",
               jax.local_device_count(), jax.device_count())
  return True


class PeerWatchdog:
  """Ends this process when another one of the job is lost.

  Polls the coordination service's list of live processes (kept from the
  processes' heartbeats, which JAX sends from a thread of its own, so a busy
  Python thread is never mistaken for a dead host). The service answers that
  call once every live process has made it, so all watchdogs poll together.
  A process that finished normally announces it first and is not reported.
  """

  _active: "PeerWatchdog | None" = None

  def __init__(self, heartbeat_timeout: int):
    self.heartbeat_timeout = heartbeat_timeout
    self.interval = min(5.0, max(0.5, heartbeat_timeout / 10))
    self._stop = threading.Event()

  def start(self) -> "PeerWatchdog":
    if jax.process_count() > 1:
      threading.Thread(target=self._run, name="helpsteer-peer-watchdog", daemon=True).start()
      PeerWatchdog._active = self
    return self

  def _finished_peers(self, client) -> set[int]:
    try:
      return {int(k.rsplit("/", 1)[1]) for k, _ in client.key_value_dir_get(f"{_KEY}/finished/")}
    except Exception:  # noqa: BLE001 - the service is gone: the live-node check reports it
      return set()

  def _run(self) -> None:
    client, me, count = _client(), jax.process_index(), jax.process_count()
    everyone = list(range(count))
    while not self._stop.wait(self.interval):
      try:
        live = set(client.get_live_nodes(everyone))
      except Exception as e:  # noqa: BLE001
        if self._stop.is_set():
          return
        _peer_lost(f"process {me} of {count} lost the coordination service on process 0"
                   f" ({str(e).strip().splitlines()[0][:160] if str(e).strip() else e})")
      lost = sorted(set(everyone) - live - self._finished_peers(client))
      if lost and not self._stop.is_set():
        _peer_lost(f"process {me} of {count}: process(es) {lost} stopped sending heartbeats for"
                   f" {self.heartbeat_timeout} s (distributed.heartbeat_timeout) and are lost")

  def stop(self) -> None:
    self._stop.set()


def _peer_lost(message: str) -> None:
  _exit_with(f"{message}; rerun every process to resume from the last complete checkpoint",
             PEER_LOST_EXIT)


def _exit_with(message: str, status: int) -> None:
  """One line on stderr, then exit at once (from any thread, even mid-collective)."""
  sys.stderr.write(f"\nerror: {message}\n")  # a progress bar may hold the current line
  sys.stderr.flush()
  os._exit(status)


def exit_after_error() -> None:
  """Ends a multi-process run after an unexpected error, never hanging.

  A collective whose peer died raises here, and the interpreter's normal
  shutdown would then block inside the runtime. The traceback is printed,
  the watchdog gets its timeout to report a lost peer (exit 75), and
  otherwise the process exits 1 (its peers then report it lost).
  """
  traceback.print_exc()
  sys.stderr.flush()
  watchdog = PeerWatchdog._active
  if watchdog is not None and not watchdog._stop.is_set():
    time.sleep(watchdog.heartbeat_timeout + 2 * watchdog.interval)
  os._exit(1)


def finish(timeout: float = 300) -> None:
  """Ends a multi-process run cleanly: after every process got here, process 0 last.

  The others disconnect first: process 0 hosts the coordination service, and
  a process still connected when it goes away is aborted by JAX's runtime.
  A peer that fails on the way here is reported by the watchdog.
  """
  watchdog = PeerWatchdog._active
  if watchdog is None or not jax.distributed.is_initialized():
    return
  client, me = _client(), jax.process_index()
  client.key_value_set(f"{_KEY}/finished/{me}", "1")
  client.wait_at_barrier(f"{_KEY}/finish", int(timeout * 1000))
  watchdog.stop()
  if me == 0:
    # Returns once every other process has called it or is gone; theirs
    # no longer call it, so this waits for them to disconnect.
    client.get_live_nodes(list(range(jax.process_count())))
  jax.distributed.shutdown()


def broadcast_from_primary(value: Any) -> Any:
  """Process 0's `value` on every process (a JSON-serialisable decision).

  Decisions that end a loop, skip work or pick a file must be the same on
  every process; the ones read from a shared filesystem (which another
  process may be writing) are made on process 0 and broadcast.
  """
  if jax.process_count() == 1:
    return value
  global _broadcasts
  _broadcasts += 1
  key = f"{_KEY}/broadcast/{_broadcasts}"
  client = _client()
  if processes.is_primary():
    client.key_value_set(key, json.dumps(value))
    return value
  return json.loads(client.blocking_key_value_get(key, 3_600_000))


_broadcasts = 0


def barrier(name: str, timeout: float = 600) -> None:
  """Waits until every process got here (the coordination service's barrier: no device
  collective, so it also holds before any program runs)."""
  if jax.process_count() == 1:
    return
  global _barriers
  _barriers += 1
  _client().wait_at_barrier(f"{_KEY}/barrier/{name}/{_barriers}", int(timeout * 1000))


_barriers = 0


def quiet_non_primary() -> None:
  """Only process 0 logs at INFO: one progress bar, one set of messages."""
  if not processes.is_primary():
    logging.set_verbosity(logging.WARNING)
