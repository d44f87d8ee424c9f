"""LoRA train step: helpsteer-jax LoRA vs. helpsteer-jax full fine-tuning vs. PyTorch + peft LoRA.

python benchmarks/lora_step.py [--batch 4 --seq 1024 --rank 16 --repeats 3]

The same ~100M Llama (identical initial weights, fp32), the same batch and
AdamW (lr 1e-4, betas 0.9/0.98, weight decay 0.01, global-norm clip 1.0).
LoRA on all seven projections (q, k, v, o, gate, up, down) with the same
rank and alpha = 2 x rank on both sides, the base frozen; full fine-tuning
is the AC-SFT step of benchmarks/train_step.py. Each runs in its own
process; timed steps alternate, each right after an untimed step of the
same worker. Reports tokens/s and each process's peak resident memory.
Writes benchmarks/results/lora_step.json and the table in docs/results.md.
"""

from __future__ import annotations

import argparse
import tempfile

import common

common.setup_cpu_process()

LR, BETAS, WD, CLIP = 1e-4, (0.9, 0.98), 0.01, 1.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _tokens(batch, seq, vocab):
  import numpy as np
  return np.random.RandomState(0).randint(3, vocab, (batch, seq + 1)).astype(np.int32)


def jax_worker(conn, hf_dir, batch, seq, rank):
  import functools
  import os
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax
  import numpy as np

  from helpsteer_jax import runtime
  from helpsteer_jax.data.features.next_token import next_token_features
  from helpsteer_jax.load import model as loader
  from helpsteer_jax.losses.sft import sft_loss
  from helpsteer_jax.train import loop
  from helpsteer_jax.train import state as state_lib

  config = common.bench_train_config(hf_dir, batch, seq, lr=LR, betas=BETAS, weight_decay=WD,
                                     clip=CLIP)
  config.model.lora.update(rank=rank, alpha=2.0 * rank)
  rt = runtime.setup(config)
  parts = state_lib.split_model(loader.load_model(config, rt, loader.TRAIN), rt.mesh, rt.rules)
  tokens = _tokens(batch, seq, runtime.model_config(config).vocab_size)
  features = [next_token_features(t, np.ones(seq + 1, bool)) for t in tokens]
  trainer = loop.Trainer(config, tempfile.mkdtemp(), rt, parts,
                         functools.partial(sft_loss, chunk_size=256), features)
  arrays, _ = trainer._next_batch()
  stats = {"trainable_params": sum(x.size for x in jax.tree.leaves(trainer.state.params))}

  def run_once():
    with jax.set_mesh(rt.mesh):
      trainer.state, metrics = trainer.train_step(trainer.state, arrays, *trainer.frozen)
      jax.block_until_ready(metrics)
    stats["last_loss"] = float(metrics["loss"])

  common.serve(conn, run_once, lambda: stats)


def peft_worker(conn, hf_dir, batch, seq, rank):
  import peft
  import torch
  import transformers
  base = transformers.LlamaForCausalLM.from_pretrained(hf_dir, attn_implementation="sdpa",
                                                       dtype=torch.float32)
  model = peft.get_peft_model(base, peft.LoraConfig(r=rank, lora_alpha=2 * rank,
                                                    lora_dropout=0.0, target_modules=TARGETS))
  model.train()
  trainable = [p for p in model.parameters() if p.requires_grad]
  opt = torch.optim.AdamW(trainable, lr=LR, betas=BETAS, weight_decay=WD, eps=1e-8)
  tokens = torch.from_numpy(_tokens(batch, seq, base.config.vocab_size).astype("int64"))
  inputs, labels = tokens[:, :-1], tokens[:, 1:]
  stats = {"trainable_params": sum(p.numel() for p in trainable)}

  def run_once():
    stats["last_loss"] = common.torch_sft_step(model, opt, trainable, inputs, labels, CLIP)

  common.serve(conn, run_once, lambda: stats)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--seq", type=int, default=1024)
  parser.add_argument("--rank", type=int, default=16)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()

  import torch
  import transformers
  torch.manual_seed(0)
  cfg, hf_cfg = common.hf_llama_config("bench_100m")
  with tempfile.TemporaryDirectory() as hf_dir:
    transformers.LlamaForCausalLM(hf_cfg).save_pretrained(hf_dir)
    workers = {"jax_lora": common.Worker(jax_worker, hf_dir, args.batch, args.seq, args.rank),
               "jax_full": common.Worker(jax_worker, hf_dir, args.batch, args.seq, 0),
               "peft_lora": common.Worker(peft_worker, hf_dir, args.batch, args.seq, args.rank)}
    times, stats = common.run_workers(workers, args.repeats)

  tokens = args.batch * args.seq
  tps = {k: tokens / common.median(v) for k, v in times.items()}
  result = {
      "benchmark": "lora_step", "model": "bench_100m", "params": cfg.num_params(),
      "batch": args.batch, "seq": args.seq, "rank": args.rank, "alpha": 2 * args.rank,
      "targets": TARGETS, "dtype": "float32",
      "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
      "lora_vs_peft": round(tps["jax_lora"] / tps["peft_lora"], 3),
      "lora_vs_full": round(tps["jax_lora"] / tps["jax_full"], 3),
      "peak_rss_mb": {k: stats[k]["peak_rss_mb"] for k in stats},
      "trainable_params": {k: stats[k]["trainable_params"] for k in stats},
      "losses": {k: stats[k]["last_loss"] for k in stats},
      "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
      "machine": common.machine(),
  }
  common.write_result("lora_step", result)
  names = {"jax_lora": "helpsteer-jax LoRA", "jax_full": "helpsteer-jax full fine-tuning",
           "peft_lora": "PyTorch + peft LoRA"}
  rows = [[names[k], f"{args.batch} x {args.seq}", f"{result['trainable_params'][k] / 1e6:.2f}M",
           f"{tps[k]:.0f}", f"{tps[k] / tps['peft_lora']:.2f}",
           f"{result['peak_rss_mb'][k]:.0f}"] for k in names]
  common.update_doc_table(
      "lora-step-benchmark",
      ["step (Llama 106M, fp32, rank %d, all 7 projections)" % args.rank, "batch x seq",
       "trainable params", "tokens/s", "vs peft", "peak RSS MB"], rows)


if __name__ == "__main__":
  main()
