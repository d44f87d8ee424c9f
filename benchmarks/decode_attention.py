"""Decode attention over the live span against the dense path over the whole bucket.

python benchmarks/decode_attention.py [--rows 16,64 --cases 264:190,520:400
                                       --blocks 32,64,128 --repeats 7] [--smoke]

On SmolLM2-135M's attention shape (9 query heads, 3 kv heads, head_dim 64,
30 layers, fp32), one decode query per row against a cache of S slots (an
engine length bucket: a power of two plus an 8-step chunk) whose live rows
span `span` slots: the longest row starts at slot 0 (where the engine's
re-layout puts it), the others later, every row's query at slot span - 1.
Times `attention.cached_attention` (reads all S slots) against
`live_attention.live_attention` (blocks of 32 / 64 / 128 slots in a loop with
a traced trip count) and `live_attention.window_attention` (one window, a
multiple of 64 slots), each for one layer and for 30 layers (30 caches, each
layer's output the next one's query, one jitted program), interleaved in one
process (medians). Every variant's output is checked against the dense one
first. Writes benchmarks/results/decode_attention.json and the table in
docs/results.md.
"""

from __future__ import annotations

import argparse
import functools

import common

common.setup_cpu_process()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from helpsteer_jax.models import attention, catalog, live_attention  # noqa: E402


def _inputs(cfg, rows: int, slots: int, span: int, layers: int, seed: int = 0):
  """q [rows, 1, H, D], per-layer caches [rows, K, S, D], the step's MaskInfo, first."""
  rng = np.random.default_rng(seed)
  end = span - 1
  start = rng.integers(0, span // 2, rows).astype(np.int32)
  start[0] = 0
  slot = np.arange(slots)[None]
  filled = ((slot >= start[:, None]) & (slot <= end)).astype(np.int32)
  info = attention.MaskInfo(jnp.ones((rows, 1), jnp.int32), jnp.asarray(filled), jnp.int32(end))
  shape = (rows, cfg.num_kv_heads, slots, cfg.head_dim)
  ks = [jnp.asarray(rng.standard_normal(shape, np.float32)) for _ in range(layers)]
  vs = [jnp.asarray(rng.standard_normal(shape, np.float32)) for _ in range(layers)]
  q = jnp.asarray(rng.standard_normal((rows, 1, cfg.num_heads, cfg.head_dim), np.float32))
  return q, ks, vs, info, jnp.int32(int(start.min()))


def _stack(attend, q, ks, vs, info, first):
  """The layers' attention in sequence: each output is the next layer's query."""
  for k, v in zip(ks, vs):
    q = attend(q, k, v, info, first)
  return q


def variants(slots: int, blocks: list[int]) -> dict:
  out = {"dense": lambda q, k, v, info, first: attention.cached_attention(q, k, v, info)}
  for b in blocks:
    out[f"live b{b}"] = functools.partial(
        lambda q, k, v, info, first, b: live_attention.live_attention(q, k, v, info, first,
                                                                      block=b), b=b)
  sizes = live_attention.window_sizes(slots)
  out["window"] = lambda q, k, v, info, first: live_attention.window_attention(
      q, k, v, info, first, sizes=sizes)
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--model", default="smollm2_135m")
  parser.add_argument("--rows", default="16,64")
  parser.add_argument("--cases", default="264:190,520:400", help="slots:span,...")
  parser.add_argument("--blocks", default="32,64,128")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--smoke", action="store_true", help="16 rows, 264:190, 3 repeats")
  args = parser.parse_args()
  if args.smoke:
    args.rows, args.cases, args.repeats = "16", "264:190", 3

  cfg = catalog.model_config(args.model)
  blocks = [int(b) for b in args.blocks.split(",")]
  results = []
  for rows in (int(r) for r in args.rows.split(",")):
    for slots, span in (map(int, c.split(":")) for c in args.cases.split(",")):
      q, ks, vs, info, first = _inputs(cfg, rows, slots, span, cfg.num_layers)
      fns, want = {}, None
      for name, attend in variants(slots, blocks).items():
        one = jax.jit(attend)
        every = jax.jit(functools.partial(_stack, attend))
        got = every(q, ks, vs, info, first)
        if want is None:
          want = got
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4)
        one(q, ks[0], vs[0], info, first).block_until_ready()
        fns[f"{name} | 1"] = functools.partial(
            lambda f: f(q, ks[0], vs[0], info, first).block_until_ready(), one)
        fns[f"{name} | {cfg.num_layers}"] = functools.partial(
            lambda f: f(q, ks, vs, info, first).block_until_ready(), every)
      times = common.interleaved_times(fns, args.repeats)
      ms = {name: round(1e3 * common.median(t), 3) for name, t in times.items()}
      row = {"rows": rows, "slots": slots, "span": span, "ms": ms}
      print(row, flush=True)
      results.append(row)

  common.write_result("decode_attention", {
      "benchmark": "decode_attention", "model": args.model, "dtype": "float32",
      "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
      "layers": cfg.num_layers, "repeats": args.repeats, "machine": common.machine(),
      "results": results})
  names = list(variants(264, blocks))
  layers = cfg.num_layers
  common.update_doc_table(
      "decode-attention",
      ["rows", "slots", "live span", "layers"] + [f"{n} ms" for n in names],
      [[str(r["rows"]), str(r["slots"]), str(r["span"]), str(n)]
       + [f"{r['ms'][f'{v} | {n}']:.2f}" for v in names]
       for r in results for n in (1, layers)])


if __name__ == "__main__":
  main()
