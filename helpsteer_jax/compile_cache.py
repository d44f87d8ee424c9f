"""JAX's persistent compilation cache, kept in the workdir (`config.compile_cache`).

A process that compiles a program first looks for its executable in the
cache directory, keyed on the program, the devices and the XLA flags; a miss
compiles and writes it there. A restarted server (or a resumed run) then
reads its programs instead of compiling them again. JAX writes entries from
process 0 only (`jax._src.compiler._cache_write`), every process reads them,
so a multi-host run needs a directory that every process sees.

`compile_cache.dir`: "workdir" (`<workdir>/compile_cache`), a path, or "" (off).
`compile_cache.min_compile_secs`: programs that compiled faster are not written
(JAX's default 1 s leaves most of a small model's programs out).
"""

from __future__ import annotations

import dataclasses
import pathlib
import threading
from typing import Any

import jax
import ml_collections
from absl import logging
from jax.experimental.compilation_cache import compilation_cache as jax_cache

IN_WORKDIR = "workdir"
SUBDIR = "compile_cache"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
HIT_EVENT = "/jax/compilation_cache/cache_hits"
# Where a compile's time goes: tracing to a jaxpr, lowering it to StableHLO, and XLA's
# compile (or the read from the persistent cache).
PHASE_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
                "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
                COMPILE_EVENT: "compile"}


def resolve(directory: str, workdir: str | pathlib.Path) -> pathlib.Path | None:
  """The cache directory `compile_cache.dir` names (None: no cache)."""
  if not directory:
    return None
  if directory == IN_WORKDIR:
    return pathlib.Path(workdir) / SUBDIR
  return pathlib.Path(directory).expanduser()


def configure(config: ml_collections.ConfigDict,
              workdir: str | pathlib.Path) -> pathlib.Path | None:
  """Points JAX's persistent cache at `config.compile_cache`'s directory before anything
  compiles; the directory, or None (off: JAX's own settings, e.g.
  $JAX_COMPILATION_CACHE_DIR, are left as they are)."""
  spec = config.get("compile_cache")
  path = resolve(spec.dir, workdir) if spec is not None else None
  if path is not None:
    use(path, float(spec.min_compile_secs))
    logging.info("compilation cache: %s", path)
  return path


def use(path: pathlib.Path | None, min_compile_secs: float = 0.0) -> None:
  """JAX's persistent cache in `path` (None: off), entries of every size written, those
  that compiled in under `min_compile_secs` left out. JAX opens its cache once per
  process; a different directory resets it."""
  wanted = str(path) if path is not None else None
  if jax.config.jax_compilation_cache_dir != wanted:
    jax_cache.reset_cache()
  if path is not None:
    path.mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", wanted)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_secs))
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


@dataclasses.dataclass
class Counts:
  """Programs compiled (`compiles`, counting those read from the cache), read from the
  persistent cache (`cache_hits`), and the seconds spent tracing, lowering and compiling
  (or reading) them."""

  compiles: int = 0
  cache_hits: int = 0
  seconds: dict[str, float] = dataclasses.field(
      default_factory=lambda: dict.fromkeys(PHASE_EVENTS.values(), 0.0))

  @property
  def compiled_here(self) -> int:
    """Programs XLA compiled in this process (not read from the cache)."""
    return self.compiles - self.cache_hits


class CompileCounter:
  """Counts this process's compiles and persistent-cache hits from JAX's monitoring
  events, from construction on (a listener cannot be removed: keep one per process)."""

  def __init__(self):
    self._counts = Counts()
    self._lock = threading.Lock()
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)
    jax.monitoring.register_event_listener(self._on_event)

  @property
  def count(self) -> int:
    return self._counts.compiles

  @property
  def cache_hits(self) -> int:
    return self._counts.cache_hits

  def snapshot(self) -> Counts:
    with self._lock:
      return dataclasses.replace(self._counts, seconds=dict(self._counts.seconds))

  def _on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
    phase = PHASE_EVENTS.get(event)
    if phase is None:
      return
    with self._lock:
      self._counts.seconds[phase] += duration
      if event == COMPILE_EVENT:
        self._counts.compiles += 1

  def _on_event(self, event: str, **kwargs: Any) -> None:
    if event == HIT_EVENT:
      with self._lock:
        self._counts.cache_hits += 1
