"""Attribute-model train step and annotation throughput vs. PyTorch + transformers.

python benchmarks/attribute_model.py [--batch 4 --seq 1024 --sequences 64 --repeats 5]

The same ~100M Llama backbone (identical initial weights) with the same fp32
9-way head. Train step: masked MSE on the last token of full-length rows,
AdamW (lr 1e-5, betas 0.9/0.98, weight decay 0.01, clip 1.0), fp32.
Annotation: `--sequences` prompts+responses of random length (64..512
tokens) scored with no gradient, both sides sorted by length into batches of
`--score-batch` right-padded to a multiple of 64, the head read at each
row's last real token. Each framework runs in its own process; their timed
repetitions alternate, each right after an untimed one of the same
framework. Writes benchmarks/results/attribute_model.json and
the table in docs/results.md.
"""

from __future__ import annotations

import argparse
import tempfile

import common

common.setup_cpu_process()

LR, BETAS, WD, CLIP = 1e-5, (0.9, 0.98), 0.01, 1.0
MAX_LEN = 512  # the scorer's longest input: length buckets 64, 128, 256, 512


def _tokens(batch, seq, vocab):
  import numpy as np
  return np.random.RandomState(0).randint(3, vocab, (batch, seq)).astype(np.int32)


def _labels(batch):
  import numpy as np
  labels = np.full((batch, 9), -100.0, np.float32)
  labels[:, 4:] = np.random.RandomState(1).randint(0, 5, (batch, 5))
  return labels


def _score_sequences(n, vocab):
  import numpy as np
  rng = np.random.RandomState(2)
  return [rng.randint(3, vocab, rng.randint(64, 513)).astype(np.int32) for _ in range(n)]


def _batches(seqs, batch):
  """Length-sorted batches, each padded to its length bucket (what the ModelScorer does)."""
  from helpsteer_jax.scoring.model import length_batches, length_buckets, pad_batch
  buckets = length_buckets(MAX_LEN)
  out = []
  for idx in length_batches([len(s) for s in seqs], batch):
    length = next(b for b in buckets if b >= max(len(seqs[i]) for i in idx))
    out.append(pad_batch([seqs[i] for i in idx], batch, length))
  return out


def jax_worker(conn, hf_dir, head_path, mode, batch, seq, sequences, score_batch):
  import os
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax
  import numpy as np

  from helpsteer_jax import config_base, config_sections, runtime
  from helpsteer_jax.config_sections import optimizer_config
  from helpsteer_jax.data.batches import REGRESSION_BATCH
  from helpsteer_jax.data.features.regression_ids import RegressionTokenizer
  from helpsteer_jax.load import model as loader
  from helpsteer_jax.losses.regression import regression_loss
  from helpsteer_jax.scoring.model import ModelScorer
  from helpsteer_jax.train import loop
  from helpsteer_jax.train import state as state_lib

  config = config_base.base_config("bench")
  config.model = config_base.model_section("bench_100m")
  config.data = config_base.data_config(packing=False)
  config.mesh = config_base.mesh_config(1, 1, 1)
  config.init = config_sections.init_config(hf_path=hf_dir, head=head_path)
  config.train = config_sections.train_config(num_steps=1000, global_batch=batch, micro_batch=batch,
                                   seq_len=seq, export_hf=False, save_every=10**9)
  config.optimizer = optimizer_config(lr=LR, b1=BETAS[0], b2=BETAS[1], weight_decay=WD,
                                      grad_clip=CLIP, schedule="constant", warmup_steps=0)
  rt = runtime.setup(config)
  model = loader.load_model(config, rt, loader.REWARD)
  stats = {}
  if mode == "train":
    vocab = runtime.model_config(config).vocab_size
    features = []
    for ids, lab in zip(_tokens(batch, seq, vocab), _labels(batch)):
      per_token = np.full((seq, 9), -100.0, np.float32)
      per_token[-1] = lab
      readout = np.zeros(seq, np.float32)
      readout[-1] = 1
      features.append(REGRESSION_BATCH.example(inputs=ids, labels=per_token, readout=readout))
    parts = state_lib.split_model(model, rt.mesh, rt.rules)
    del model
    trainer = loop.Trainer(config, tempfile.mkdtemp(), rt, parts, regression_loss, features)
    arrays, _ = trainer._next_batch()

    def run_once():
      with jax.set_mesh(rt.mesh):
        trainer.state, metrics = trainer.train_step(trainer.state, arrays, *trainer.frozen)
        jax.block_until_ready(metrics)
      stats["last_loss"] = float(metrics["loss"])
  else:
    # Token ids are scored directly (score_ids): the tokenizer is never asked.
    scorer = ModelScorer(model, rt, RegressionTokenizer(None, MAX_LEN), score_batch)
    seqs = _score_sequences(sequences, runtime.model_config(config).vocab_size)

    def run_once():
      stats["checksum"] = float(np.sum(scorer.score_ids(seqs)))

  common.serve(conn, run_once, lambda: stats)


def torch_worker(conn, hf_dir, head_path, mode, batch, seq, sequences, score_batch):
  import numpy as np
  import torch
  import transformers
  backbone = transformers.LlamaModel.from_pretrained(hf_dir, attn_implementation="sdpa",
                                                     dtype=torch.float32)
  head = torch.nn.Linear(backbone.config.hidden_size, 9)
  with np.load(head_path) as f, torch.no_grad():
    head.weight.copy_(torch.from_numpy(f["kernel"].T.copy()))
    head.bias.copy_(torch.from_numpy(f["bias"]))
  stats = {}
  if mode == "train":
    params = (list(backbone.named_parameters())
              + [("head." + n, p) for n, p in head.named_parameters()])
    decay = [p for n, p in params if "norm" not in n and "bias" not in n]
    no_decay = [p for n, p in params if "norm" in n or "bias" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS,
                            eps=1e-8)
    tokens = torch.from_numpy(_tokens(batch, seq, backbone.config.vocab_size).astype("int64"))
    labels = torch.from_numpy(_labels(batch))
    backbone.train()

    def run_once():
      opt.zero_grad(set_to_none=True)
      hidden = backbone(input_ids=tokens).last_hidden_state
      preds = head(hidden[:, -1].float())
      mask = (labels != -100).float()
      loss = (mask * (preds - labels) ** 2).sum() / mask.sum()
      loss.backward()
      torch.nn.utils.clip_grad_norm_([p for _, p in params], CLIP)
      opt.step()
      stats["last_loss"] = float(loss.detach())
  else:
    backbone.eval()
    batches = _batches(_score_sequences(sequences, backbone.config.vocab_size), score_batch)

    def run_once():
      total = 0.0
      with torch.inference_mode():
        for b in batches:
          ids = torch.from_numpy(b["tokens"].astype("int64"))
          mask = torch.from_numpy(b["segment_ids"].astype("int64"))
          hidden = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
          last = (mask * torch.arange(mask.shape[1])).amax(dim=1)
          preds = head(hidden[torch.arange(len(last)), last])
          total += float(preds[mask.any(dim=1)].sum())
      stats["checksum"] = total

  common.serve(conn, run_once, lambda: stats)


def _measure(mode, args, hf_dir, head_path):
  extra = (mode, args.batch, args.seq, args.sequences, args.score_batch)
  workers = {"jax": common.Worker(jax_worker, hf_dir, head_path, *extra),
             "torch": common.Worker(torch_worker, hf_dir, head_path, *extra)}
  return common.run_workers(workers, args.repeats)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--seq", type=int, default=1024)
  parser.add_argument("--sequences", type=int, default=64)
  parser.add_argument("--score-batch", type=int, default=8)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--table-only", "--readme-only", dest="table_only", action="store_true",
                      help="rebuild the docs/results.md table from"
                      " benchmarks/results/attribute_model.json")
  args = parser.parse_args()
  if args.table_only:
    import json
    update_table(json.loads((common.RESULTS / "attribute_model.json").read_text()))
    return

  import numpy as np
  import torch
  import transformers
  torch.manual_seed(0)
  cfg, hf_cfg = common.hf_llama_config("bench_100m")
  with tempfile.TemporaryDirectory() as hf_dir:
    transformers.LlamaForCausalLM(hf_cfg).save_pretrained(hf_dir)
    head_path = f"{hf_dir}/head.npz"
    rng = np.random.RandomState(0)
    np.savez(head_path, kernel=rng.normal(0, 0.02, (cfg.hidden_size, 9)).astype(np.float32),
             bias=np.full(9, 2.0, np.float32))
    train_times, train_stats = _measure("train", args, hf_dir, head_path)
    score_times, score_stats = _measure("score", args, hf_dir, head_path)

  tokens = args.batch * args.seq
  tps = {k: tokens / common.median(v) for k, v in train_times.items()}
  sps = {k: args.sequences / common.median(v) for k, v in score_times.items()}
  result = {
      "benchmark": "attribute_model", "model": "bench_100m", "params": cfg.num_params(),
      "dtype": "float32",
      "train": {"batch": args.batch, "seq": args.seq,
                "jax_tokens_per_s": round(tps["jax"], 1),
                "torch_tokens_per_s": round(tps["torch"], 1),
                "ratio": round(tps["jax"] / tps["torch"], 3),
                "jax_peak_rss_mb": train_stats["jax"]["peak_rss_mb"],
                "torch_peak_rss_mb": train_stats["torch"]["peak_rss_mb"],
                "losses": {k: v["last_loss"] for k, v in train_stats.items()},
                "seconds": {k: [round(t, 3) for t in v] for k, v in train_times.items()}},
      "annotation": {"sequences": args.sequences, "lengths": "64..512", "batch": args.score_batch,
                     "jax_sequences_per_s": round(sps["jax"], 2),
                     "torch_sequences_per_s": round(sps["torch"], 2),
                     "ratio": round(sps["jax"] / sps["torch"], 3),
                     "checksums": {k: v["checksum"] for k, v in score_stats.items()},
                     "seconds": {k: [round(t, 3) for t in v] for k, v in score_times.items()}},
      "machine": common.machine(),
  }
  common.write_result("attribute_model", result)
  update_table(result)


def update_table(result: dict) -> None:
  """The docs/results.md table from a result (also `--table-only`, from the saved JSON)."""
  train, ann = result["train"], result["annotation"]
  name = f"Llama {result['params'] / 1e6:.0f}M + 9-way head, fp32"
  rows = [[name, "train step (tokens/s)", f"{train['batch']} x {train['seq']}",
           f"{train['jax_tokens_per_s']:.0f}", f"{train['torch_tokens_per_s']:.0f}",
           f"{train['ratio']:.2f}"],
          [name, "annotation (sequences/s)",
           f"{ann['sequences']} seqs of {ann['lengths']} tokens, batch {ann['batch']}",
           f"{ann['jax_sequences_per_s']:.2f}", f"{ann['torch_sequences_per_s']:.2f}",
           f"{ann['ratio']:.2f}"]]
  common.update_doc_table(
      "attribute-model-benchmark",
      ["model", "measure", "shape", "helpsteer-jax", "PyTorch", "ratio"], rows)

if __name__ == "__main__":
  main()
