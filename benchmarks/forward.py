"""Forward tokens/s: our model vs. transformers' PyTorch Llama, same weights.

python benchmarks/forward.py [--batch 4 --seq 1024 --repeats 5]

Builds a ~100M-parameter Llama in transformers, saves it, imports it with our
HF loader (so both run identical weights), checks the logits agree, then times
full forwards (hidden states and fp32 logits) interleaved. Writes
benchmarks/results/forward.json and the table in docs/results.md.
"""

from __future__ import annotations

import argparse

import common

common.setup_cpu_process()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--seq", type=int, default=1024)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--attention", default="blockwise")
  args = parser.parse_args()

  cfg, pt_model, model = common.bench_model_pair(args.attention)
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, tokens):
    m = nnx.merge(graphdef, state)
    return m.logits(m(tokens))

  rng = np.random.RandomState(0)
  tokens = rng.randint(0, cfg.vocab_size, (args.batch, args.seq)).astype(np.int32)
  jax_tokens, pt_tokens = jnp.asarray(tokens), torch.from_numpy(tokens.astype(np.int64))
  with torch.inference_mode():
    ref = pt_model(pt_tokens[:1, :128]).logits.numpy()
  ours = np.asarray(forward(state, jax_tokens[:1, :128]))
  max_diff = float(np.max(np.abs(ours - ref)))
  assert max_diff < 1e-3, max_diff

  def run_jax():
    jax.block_until_ready(forward(state, jax_tokens))

  def run_torch():
    with torch.inference_mode():
      pt_model(pt_tokens)

  run_jax(), run_torch()  # compile / warm up
  times = common.interleaved_times({"jax": run_jax, "torch": run_torch}, args.repeats)
  n_tokens = args.batch * args.seq
  jax_tps = n_tokens / common.median(times["jax"])
  torch_tps = n_tokens / common.median(times["torch"])
  result = {
      "benchmark": "forward",
      "model": "bench_100m", "params": cfg.num_params(),
      "batch": args.batch, "seq": args.seq, "attention_impl": args.attention,
      "jax_tokens_per_s": round(jax_tps, 1), "torch_tokens_per_s": round(torch_tps, 1),
      "ratio": round(jax_tps / torch_tps, 3),
      "logits_max_abs_diff": max_diff,
      "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
      "machine": common.machine(),
  }
  common.write_result("forward", result)
  common.update_doc_table(
      "forward-benchmark",
      ["model", "batch x seq", "helpsteer-jax tokens/s", "PyTorch tokens/s", "ratio"],
      [[f"Llama {cfg.num_params() / 1e6:.0f}M", f"{args.batch} x {args.seq}",
        f"{jax_tps:.0f}", f"{torch_tps:.0f}", f"{jax_tps / torch_tps:.2f}"]])


if __name__ == "__main__":
  main()
