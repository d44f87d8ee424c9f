"""The one batched pass of a fixed-weights forward (RL's
log-probs and critic values, SteerLM 2.0's group NLLs, the preference
reference's per-segment sums, the attribute model's scores): host rows in
fixed-size batches, every process putting only its own devices' rows, a short
last batch padded with zero rows (one program per batch shape, which `jax.jit`
caches: a caller that pads lengths to buckets gets one per bucket), outputs
replicated so that every process reads every row, the padding rows dropped.
What the pass computes (the head, the reduction) is the caller's.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

Pending = tuple[int, Any]  # (real rows, the batch's outputs, maybe still computing)


def padded(batch: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
  """`batch` with zero rows appended to `rows` rows."""
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    out[k] = v if len(v) == rows else np.concatenate(
        [v, np.zeros((rows - len(v),) + v.shape[1:], v.dtype)])
  return out


class FrozenPass:
  """`fn(*args, batch) -> outputs` (each output's leading axis the batch's rows) over
  batches of `rows` rows laid out by `batch_sharding` ([rows, ...] arrays).

  `arg_shardings`: the shardings of `args` (the weights), or None to take them from
  the arrays as they are.
  """

  def __init__(self, fn: Callable[..., Any], mesh: jax.sharding.Mesh,
               batch_sharding: NamedSharding, rows: int,
               arg_shardings: Sequence[Any] | None = None):
    self.mesh, self.sharding, self.rows = mesh, batch_sharding, int(rows)
    replicated = NamedSharding(mesh, PartitionSpec())
    kw = {} if arg_shardings is None else {
        "in_shardings": (*arg_shardings, batch_sharding)}
    with jax.set_mesh(mesh):
      self._fn = jax.jit(fn, out_shardings=replicated, **kw)

  @property
  def compiled_variants(self) -> int:
    """Programs compiled (or read from the compilation cache) so far: one per batch
    shape."""
    return self._fn._cache_size()

  def dispatch(self, args: Sequence[Any], batch: Mapping[str, np.ndarray]) -> Pending:
    """Starts the pass over one batch of at most `rows` host rows (every field [n, ...])."""
    n = len(next(iter(batch.values())))
    if n > self.rows:
      raise ValueError(f"a batch of {n} rows for a pass of {self.rows}")
    arrays = {k: jax.make_array_from_callback(v.shape, self.sharding, lambda i, v=v: v[i])
              for k, v in padded(batch, self.rows).items()}
    with jax.set_mesh(self.mesh):
      return n, self._fn(*args, arrays)

  def batches(self, args: Sequence[Any], rows: Mapping[str, np.ndarray]) -> list[Pending]:
    """Starts the pass over all of `rows` (every field [N, ...]), `rows` rows at a time."""
    total = len(next(iter(rows.values())))
    return [self.dispatch(args, {k: v[lo:lo + self.rows] for k, v in rows.items()})
            for lo in range(0, total, self.rows)]

  @staticmethod
  def fetch(pending: Sequence[Pending]) -> Any:
    """The outputs of `pending` on the host, padding rows dropped, concatenated along the
    row axis (the tree of one batch's outputs)."""
    host = jax.device_get([out for _, out in pending])
    trimmed = [jax.tree.map(lambda x, n=n: np.asarray(x)[:n], out)
               for (n, _), out in zip(pending, host)]
    return jax.tree.map(lambda *xs: np.concatenate(xs), *trimmed)

  def __call__(self, args: Sequence[Any], rows: Mapping[str, np.ndarray]) -> Any:
    """The outputs over all of `rows`, on the host."""
    return self.fetch(self.batches(args, rows))
