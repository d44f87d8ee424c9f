"""Decode tokens/s: our engine's batch API vs. transformers' PyTorch `generate`.

python benchmarks/decode.py [--batches 1,16 --prompt 64 --new 128 --repeats 3]

Builds the ~100M-parameter Llama in transformers, saves it and imports it with
our HF loader (identical weights), then times greedy generation of `--new`
tokens after a `--prompt`-token prompt (prefill included), both frameworks
interleaved in one process, fp32. Every row generates all `--new` tokens (no
EOS). Checks that the greedy tokens agree and that nothing compiles after the
engine's warm-up (its compiled variants stay fixed). Writes
benchmarks/results/decode.json and the table in docs/results.md.
"""

from __future__ import annotations

import argparse

import common

common.setup_cpu_process()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from helpsteer_jax import sharding  # noqa: E402
from helpsteer_jax.inference.engine import DecodeRequest, Engine  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--batches", default="1,16")
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--new", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--attention", default="blockwise")
  args = parser.parse_args()

  cfg, pt_model, model = common.bench_model_pair(args.attention)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  rows = []
  for batch in (int(b) for b in args.batches.split(",")):
    engine = Engine(model, mesh, None, max_batch=batch, max_length=args.prompt + args.new)
    prompts = np.random.RandomState(batch).randint(3, cfg.vocab_size, (batch, args.prompt))
    pt_prompts = torch.from_numpy(prompts.astype(np.int64))
    outputs = {}

    def run_jax():
      done = engine.generate([DecodeRequest(p, args.new) for p in prompts.tolist()])
      outputs["jax"] = np.asarray([o.token_ids for o in done])

    def run_torch():
      with torch.inference_mode():
        out = pt_model.generate(pt_prompts, attention_mask=torch.ones_like(pt_prompts),
                                max_new_tokens=args.new, min_new_tokens=args.new,
                                do_sample=False, pad_token_id=0)
      outputs["torch"] = out[:, args.prompt:].numpy()

    engine.warm_up()  # every shape the engine can use; no call compiles after it
    compiled = engine.compiled_variants
    run_jax(), run_torch()  # warm caches
    times = common.interleaved_times({"jax": run_jax, "torch": run_torch}, args.repeats)
    recompiled = engine.compiled_variants - compiled
    assert recompiled == 0, recompiled
    agree = float(np.mean(outputs["jax"] == outputs["torch"]))
    n_tokens = batch * args.new
    jax_tps = n_tokens / common.median(times["jax"])
    torch_tps = n_tokens / common.median(times["torch"])
    rows.append({"batch": batch, "jax_tokens_per_s": round(jax_tps, 1),
                 "torch_tokens_per_s": round(torch_tps, 1),
                 "ratio": round(jax_tps / torch_tps, 3),
                 "greedy_token_agreement": round(agree, 4),
                 "compiles_warm_up": compiled, "compiles_after_warm_up": recompiled,
                 "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()}})
    print(rows[-1])

  result = {"benchmark": "decode", "model": "bench_100m", "params": cfg.num_params(),
            "prompt_tokens": args.prompt, "new_tokens": args.new, "dtype": "float32",
            "attention_impl": args.attention, "rows": rows, "machine": common.machine()}
  common.write_result("decode", result)
  common.update_doc_table(
      "decode-benchmark",
      ["model", "batch", "prompt + new tokens", "helpsteer-jax tokens/s", "PyTorch tokens/s",
       "ratio", "greedy tokens equal", "compiles after warm-up"],
      [[f"Llama {cfg.num_params() / 1e6:.0f}M", str(r["batch"]),
        f"{args.prompt} + {args.new}", f"{r['jax_tokens_per_s']:.1f}",
        f"{r['torch_tokens_per_s']:.1f}", f"{r['ratio']:.2f}",
        f"{100 * r['greedy_token_agreement']:.0f}%", str(r["compiles_after_warm_up"])]
       for r in rows])


if __name__ == "__main__":
  main()
