"""Which process this is: the one test every "only process 0 does this" decision uses."""

from __future__ import annotations

import jax


def is_primary() -> bool:
  """True on process 0, the process that writes shared files, logs and asks remote services."""
  return jax.process_index() == 0
