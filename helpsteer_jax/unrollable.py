"""Loop primitives that can be unrolled for cost analysis.

XLA's cost analysis counts a while-loop body once. Code that loops (the
layer scan, attention over head groups, loss chunks) uses these wrappers;
inside `unrolled_for_analysis()` they emit straight-line code so that
`compiled.cost_analysis()` counts every iteration. Never used for running.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

import jax

_STATE = threading.local()


@contextlib.contextmanager
def unrolled_for_analysis():
  previous = getattr(_STATE, "unroll", False)
  _STATE.unroll = True
  try:
    yield
  finally:
    _STATE.unroll = previous


def unrolling() -> bool:
  return getattr(_STATE, "unroll", False)


def map_(fn: Callable, xs: Any) -> Any:
  """`jax.lax.map`, or fully unrolled under analysis."""
  if unrolling():
    return jax.lax.scan(lambda c, x: (c, fn(x)), None, xs, unroll=True)[1]
  return jax.lax.map(fn, xs)


def fori_loop(lower: int, upper: int, body: Callable, init: Any) -> Any:
  """`jax.lax.fori_loop` with static bounds, or fully unrolled under analysis."""
  return jax.lax.fori_loop(lower, upper, body, init, unroll=True if unrolling() else None)


def scan(fn: Callable, init: Any, xs: Any) -> Any:
  return jax.lax.scan(fn, init, xs, unroll=True if unrolling() else 1)
