"""The weight-matmul floor of a decode step: XLA:CPU's fp32 GEMMs against PyTorch's.

python benchmarks/gemm_floor.py [--rows 1,16,64,128 --repeats 7]

Times the chain of weight matmuls of one forward of SmolLM2-135M's 30 layers
(q, k, v, o, gate, up, down; no attention, no vocabulary head) over `rows`
token rows in fp32, with the same weights in three implementations,
interleaved in one process: XLA (one jitted program, the projections as the
model's `layers.project` computes them), PyTorch's `F.linear`, and PyTorch's
oneDNN linear on weights packed ahead of time for that row count (what
vLLM's CPU backend and Inductor's freezing use). A decode step over n live
requests cannot be faster than its chain at n rows. Writes
benchmarks/results/gemm_floor.json and the table in docs/results.md.
"""

from __future__ import annotations

import argparse

import common

common.setup_cpu_process()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from helpsteer_jax.models import catalog  # noqa: E402


def shapes(cfg) -> list[tuple[int, int]]:
  """(out, in) of one layer's weight matrices, in PyTorch's layout."""
  h, i = cfg.hidden_size, cfg.intermediate_size
  q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  return [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]


def chain(x, ws, linear, silu):
  """The layers' matmuls in the model's order; k and v feed a tiny sum so none is dead."""
  for wq, wk, wv, wo, wg, wu, wd in ws:
    q, k, v = linear(x, wq), linear(x, wk), linear(x, wv)
    x = x + linear(q, wo) + (k.sum() + v.sum()) * 1e-6
    x = x + linear(silu(linear(x, wg)) * linear(x, wu), wd)
  return x


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--model", default="smollm2_135m")
  parser.add_argument("--rows", default="1,16,64,128")
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args()

  cfg = catalog.model_config(args.model)
  rng = np.random.default_rng(0)
  weights = [[(rng.standard_normal(s) * 0.02).astype(np.float32) for s in shapes(cfg)]
             for _ in range(cfg.num_layers)]
  params = sum(w.size for layer in weights for w in layer)
  jax_ws = jax.device_put([[w.T for w in layer] for layer in weights])  # [in, out]

  def jax_linear(x, w):
    return jnp.einsum("mh,hn->mn", x, w, preferred_element_type=jnp.float32)

  jax_chain = jax.jit(lambda x, ws: chain(x, ws, jax_linear, jax.nn.silu))
  torch_ws = [[torch.from_numpy(w) for w in layer] for layer in weights]
  rows_out = []
  for m in (int(r) for r in args.rows.split(",")):
    x = np.full((m, cfg.hidden_size), 0.01, np.float32)
    tx = torch.from_numpy(x)
    packed = [[torch.ops.mkldnn._reorder_linear_weight(w, m) for w in layer]
              for layer in torch_ws]

    def onednn(a, w):
      return torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")

    fns = {
        "xla": lambda: jax_chain(x, jax_ws).block_until_ready(),
        "torch": lambda: chain(tx, torch_ws, torch.nn.functional.linear,
                               torch.nn.functional.silu),
        "torch_onednn_packed": lambda: chain(tx, packed, onednn, torch.nn.functional.silu),
    }
    with torch.inference_mode():
      want = fns["torch"]()
      np.testing.assert_allclose(np.asarray(jax_chain(x, jax_ws)), want.numpy(),
                                 rtol=1e-4, atol=1e-5)
      np.testing.assert_allclose(fns["torch_onednn_packed"]().numpy(), want.numpy(),
                                 rtol=1e-4, atol=1e-5)
      times = common.interleaved_times(fns, args.repeats)
    ms = {name: round(1e3 * common.median(t), 1) for name, t in times.items()}
    row = {"rows": m, "ms": ms,
           "gflops": {name: round(2 * m * params / t / 1e6, 1) for name, t in ms.items()}}
    print(row, flush=True)
    rows_out.append(row)

  common.write_result("gemm_floor", {
      "benchmark": "gemm_floor", "model": args.model, "weight_params": params,
      "dtype": "float32", "repeats": args.repeats, "machine": common.machine(),
      "results": rows_out})
  common.update_doc_table(
      "gemm-floor",
      ["rows", "XLA ms", "PyTorch F.linear ms", "PyTorch oneDNN packed ms", "XLA GFLOP/s",
       "oneDNN packed GFLOP/s"],
      [[str(r["rows"]), f"{r['ms']['xla']}", f"{r['ms']['torch']}",
        f"{r['ms']['torch_onednn_packed']}", f"{r['gflops']['xla']}",
        f"{r['gflops']['torch_onednn_packed']}"] for r in rows_out])


if __name__ == "__main__":
  main()
