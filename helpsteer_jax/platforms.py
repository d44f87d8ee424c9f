"""The JAX platforms a command-line run initialises: none it has no chips for.

With libtpu installed (the `tpu`, `aot` and `test` extras), JAX starts its
TPU backend on any machine; without TPU chips libtpu prints initialisation
errors to stderr ("Failed to find host bounds ...", a source-location trace)
before JAX falls back to the CPU, which reads like a crash. A run on such a
machine asks JAX for the platforms it has instead. A TPU VM (TPU chips on its
PCI bus, as JAX itself detects them) and an explicit `JAX_PLATFORMS` are left
alone. Compile-only TPU devices for AOT reports come from libtpu directly and
need no TPU backend.
"""

from __future__ import annotations

import importlib.util
import os
import pkgutil


def _tpu_chips() -> int:
  try:
    from jax._src import hardware_utils
    return hardware_utils.num_available_tpu_chips_and_device_id()[0]
  except Exception:  # noqa: BLE001 - JAX moved it: assume a TPU may be there
    return 1


def _nvidia_gpu_visible() -> bool:
  try:
    from jax._src import hardware_utils
    return bool(hardware_utils.has_visible_nvidia_gpu())
  except Exception:  # noqa: BLE001
    return True


def _cuda_plugin_installed() -> bool:
  if importlib.util.find_spec("jax_plugins") is None:
    return False
  import jax_plugins
  return any(m.name.startswith("xla_cuda") for m in pkgutil.iter_modules(jax_plugins.__path__))


def _chosen_by_user() -> bool:
  if os.environ.get("JAX_PLATFORMS"):
    return True
  import jax
  return bool(jax.config.jax_platforms)


def _libtpu_installed() -> bool:
  """Whether JAX would load libtpu: from TPU_LIBRARY_PATH (which importing libtpu sets,
  so child processes inherit it, even in another environment) or the libtpu package."""
  path = os.environ.get("TPU_LIBRARY_PATH")
  return bool(path and os.path.isfile(path)) or importlib.util.find_spec("libtpu") is not None


def platforms_for_this_machine() -> str | None:
  """A `jax_platforms` value without an absent TPU, or None to keep JAX's choice."""
  if _chosen_by_user() or not _libtpu_installed() or _tpu_chips() > 0:
    return None
  if _cuda_plugin_installed() and _nvidia_gpu_visible():
    return "cuda,cpu"
  return "cpu"


def skip_absent_tpu() -> None:
  """Before any JAX backend starts: leave out the TPU backend where no TPU is."""
  platforms = platforms_for_this_machine()
  if platforms is not None:
    import jax
    jax.config.update("jax_platforms", platforms)
