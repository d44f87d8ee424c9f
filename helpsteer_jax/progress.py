"""A progress bar on process 0 (tqdm: count, rate and ETA), silent on the others."""

from __future__ import annotations

from typing import Any

from helpsteer_jax import processes


class Progress:
  """A tqdm bar on process 0; `update(n, **postfix)` adds `n` and shows `postfix`,
  `update_to(count)` sets the count."""

  def __init__(self, total: int, initial: int, desc: str, enabled: bool | None = None,
               unit: str = "step"):
    self.enabled = processes.is_primary() if enabled is None else enabled
    self._bar = None
    if self.enabled:
      from tqdm.auto import tqdm
      self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit,
                       dynamic_ncols=True, mininterval=1.0)

  def update(self, n: int = 1, **postfix: Any) -> None:
    if self._bar is not None:
      self._bar.update(n)
      if postfix:
        self._bar.set_postfix(postfix, refresh=False)

  def update_to(self, count: int, **postfix: Any) -> None:
    """Moves the bar to `count` (a running total the caller reads, such as programs
    compiled so far)."""
    if self._bar is not None:
      self.update(count - self._bar.n, **postfix)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
