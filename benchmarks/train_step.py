"""AC-SFT train step: helpsteer-jax vs. plain PyTorch + transformers.

python benchmarks/train_step.py [--batch 4 --seq 1024 --repeats 5]

The same ~100M Llama (identical initial weights), the same batch and AdamW
(lr 1e-4, betas 0.9/0.98, weight decay 0.01, global-norm clip 1.0), fp32.
Each framework runs in its own process; their timed steps alternate, each
right after an untimed step of the same framework (as in a training loop). Also
reports each process's peak resident memory and checks the compiled step's
FLOPs (XLA cost analysis with every loop unrolled, batch 1) against the
analytic 6 x params x tokens + causal attention FLOPs with remat off.
Writes benchmarks/results/train_step.json and the table in docs/results.md.
"""

from __future__ import annotations

import argparse
import tempfile

import common

common.setup_cpu_process()

LR, BETAS, WD, CLIP = 1e-4, (0.9, 0.98), 0.01, 1.0


def _tokens(batch, seq, vocab):
  import numpy as np
  return np.random.RandomState(0).randint(3, vocab, (batch, seq + 1)).astype(np.int32)


def jax_worker(conn, hf_dir, batch, seq, analysis):
  import functools
  import os
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax
  import numpy as np

  from helpsteer_jax import runtime, unrollable
  from helpsteer_jax.data.features.next_token import next_token_features
  from helpsteer_jax.load import model as loader
  from helpsteer_jax.losses.sft import sft_loss
  from helpsteer_jax.train import loop
  from helpsteer_jax.train import state as state_lib

  def build(batch_size, **model_knobs):
    config = common.bench_train_config(hf_dir, batch_size, seq, lr=LR, betas=BETAS,
                                       weight_decay=WD, clip=CLIP, **model_knobs)
    rt = runtime.setup(config)
    parts = state_lib.split_model(loader.load_model(config, rt, loader.TRAIN), rt.mesh, rt.rules)
    tokens = _tokens(batch_size, seq, runtime.model_config(config).vocab_size)
    features = [next_token_features(t, np.ones(seq + 1, bool)) for t in tokens]
    trainer = loop.Trainer(config, tempfile.mkdtemp(), rt, parts,
                           functools.partial(sft_loss, chunk_size=256), features)
    batch_arrays, _ = trainer._next_batch()
    return trainer, batch_arrays, runtime.model_config(config)

  trainer, batch_arrays, model_cfg = build(batch)
  stats = {"params": model_cfg.num_params()}
  if analysis:
    with unrollable.unrolled_for_analysis():
      t1, b1, _ = build(1, scan_layers=False)
      with jax.set_mesh(t1.rt.mesh):
        compiled = t1.train_step.lower(t1.state, b1, *t1.frozen).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    stats["compiled_flops_batch1"] = float(cost["flops"])
    stats["analytic_flops_batch1"] = model_cfg.flops_per_token(seq) * seq
    del t1, b1, compiled

  def run_once():
    with jax.set_mesh(trainer.rt.mesh):
      trainer.state, metrics = trainer.train_step(trainer.state, batch_arrays, *trainer.frozen)
      jax.block_until_ready(metrics)
    stats["last_loss"] = float(metrics["loss"])

  common.serve(conn, run_once, lambda: stats)


def torch_worker(conn, hf_dir, batch, seq):
  import torch
  import transformers
  model = transformers.LlamaForCausalLM.from_pretrained(hf_dir, attn_implementation="sdpa",
                                                        dtype=torch.float32)
  model.train()
  opt = common.torch_adamw(model, LR, BETAS, WD)
  tokens = torch.from_numpy(_tokens(batch, seq, model.config.vocab_size).astype("int64"))
  inputs, labels = tokens[:, :-1], tokens[:, 1:]
  stats = {}

  def run_once():
    stats["last_loss"] = common.torch_sft_step(model, opt, model.parameters(), inputs, labels, CLIP)

  common.serve(conn, run_once, lambda: stats)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--seq", type=int, default=1024)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--no-analysis", action="store_true")
  args = parser.parse_args()

  import torch
  import transformers
  torch.manual_seed(0)
  cfg, hf_cfg = common.hf_llama_config("bench_100m")
  with tempfile.TemporaryDirectory() as hf_dir:
    transformers.LlamaForCausalLM(hf_cfg).save_pretrained(hf_dir)
    workers = {"jax": common.Worker(jax_worker, hf_dir, args.batch, args.seq, not args.no_analysis),
               "torch": common.Worker(torch_worker, hf_dir, args.batch, args.seq)}
    times, stats = common.run_workers(workers, args.repeats)

  tokens = args.batch * args.seq
  tps = {k: tokens / common.median(v) for k, v in times.items()}
  result = {
      "benchmark": "train_step", "model": "bench_100m", "params": cfg.num_params(),
      "batch": args.batch, "seq": args.seq, "dtype": "float32", "remat": "none",
      "jax_tokens_per_s": round(tps["jax"], 1), "torch_tokens_per_s": round(tps["torch"], 1),
      "ratio": round(tps["jax"] / tps["torch"], 3),
      "jax_peak_rss_mb": stats["jax"]["peak_rss_mb"],
      "torch_peak_rss_mb": stats["torch"]["peak_rss_mb"],
      "losses": {k: stats[k]["last_loss"] for k in stats},
      "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
      # CPU seconds (user, kernel) and page faults of every call: two warm-up
      # calls, then an untimed and a timed call per round.
      "usage_per_step": {k: stats[k]["usage_per_run"] for k in stats},
      "machine": common.machine(),
  }
  if "compiled_flops_batch1" in stats["jax"]:
    c, a = stats["jax"]["compiled_flops_batch1"], stats["jax"]["analytic_flops_batch1"]
    result.update(compiled_flops_per_step_batch1=c, analytic_flops_per_step_batch1=a,
                  flops_ratio=round(c / a, 4))
  common.write_result("train_step", result)
  rows = [[f"Llama {cfg.num_params() / 1e6:.0f}M, fp32", f"{args.batch} x {args.seq}",
           f"{tps['jax']:.0f}", f"{tps['torch']:.0f}", f"{tps['jax'] / tps['torch']:.2f}",
           f"{result['jax_peak_rss_mb']:.0f} / {result['torch_peak_rss_mb']:.0f}",
           f"{result.get('flops_ratio', float('nan')):.3f}"]]
  common.update_doc_table(
      "train-step-benchmark",
      ["model", "batch x seq", "helpsteer-jax tokens/s", "PyTorch tokens/s", "ratio",
       "peak RSS MB (jax / torch)", "compiled / analytic FLOPs"], rows)


if __name__ == "__main__":
  main()
