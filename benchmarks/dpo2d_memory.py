"""2D-DPO: memory of the fused loss, and a train step vs. PyTorch + transformers.

python benchmarks/dpo2d_memory.py [--pairs 2 --seq 1024 --repeats 3]

1. Compiled peak temporary memory (XLA `memory_analysis`, compile only) of
   the 2D-DPO loss + gradient from the final hidden states through the
   vocabulary projection (head only), vocab 128256, length 4096, 2 pairs (4
   rows), hidden 4096, fp32: the fused per-segment log-probs over vocabulary
   chunks (and over sequence chunks) vs. the naive full-logits log_softmax
   gather. Same loss, same segment sums. bf16 figures are in the JSON.
2. Train-step tokens/s and peak resident memory for the ~100M bench model,
   2 pairs x 1024 tokens, fp32, AdamW: our 2D-DPO step (reference log-probs
   precomputed, the default; with --on-the-fly also the reference in the
   step) vs. a plain PyTorch +
   transformers DPO step (TRL's sigmoid loss, chosen and rejected
   concatenated in one policy forward, reference forward on the fly under
   no_grad). Each runs in its own process; timed steps alternate, each
   right after an untimed step of the same framework.
Writes benchmarks/results/dpo2d_memory.json and the table in docs/results.md.
"""

from __future__ import annotations

import argparse
import tempfile

import common

common.setup_cpu_process()

LR, BETAS, WD, CLIP, BETA = 1e-4, (0.9, 0.98), 0.01, 1.0, 0.1
SEGMENTS, ASPECTS = 8, 5


def pair_batch(pairs, seq, vocab, seed=0):
  """Random pairs: the first half of each row is prompt, the rest 8 segments."""
  import numpy as np
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, vocab, (pairs, 2, seq + 1)).astype(np.int32)
  ids[:, 1, :seq // 2] = ids[:, 0, :seq // 2]  # shared prompt
  seg = np.zeros((pairs, 2, seq), np.int32)
  seg[:, :, seq // 2:] = 1 + np.arange(seq - seq // 2) * SEGMENTS // (seq - seq // 2)
  return {
      "inputs": ids[:, :, :-1], "targets": ids[:, :, 1:], "token_segments": seg,
      "positions": np.broadcast_to(np.arange(seq, dtype=np.int32), (pairs, 2, seq)).copy(),
      "segment_ids": np.ones((pairs, 2, seq), np.int32),
      "seg_scores": rng.randint(0, 5, (pairs, 2, SEGMENTS, ASPECTS)).astype(np.float32) / 4,
      "seg_mask": np.ones((pairs, 2, SEGMENTS), np.float32),
      "lengths": np.full((pairs, 2), seq - seq // 2, np.float32),
      "pair_weight": np.ones((pairs, 2), np.float32),
      "ref_logps": np.full((pairs, 2, SEGMENTS), -5.0 * seq / SEGMENTS, np.float32),
  }


# ----------------------------------------------------------------- 1. memory


def loss_memory(vocab=128256, seq=4096, pairs=2, hidden=4096, vocab_chunk=4096,
                seq_chunk=512, dtype="float32") -> dict:
  import jax
  import jax.numpy as jnp

  from helpsteer_jax.losses import dpo2d, logprobs

  cfg = dpo2d.PreferenceLossConfig()
  b = pair_batch(pairs, 8, 8)  # only shapes of the small arrays matter
  targets = jnp.zeros((2 * pairs, seq), jnp.int32)
  segs = jnp.asarray(jnp.arange(seq) * SEGMENTS // seq + 1, jnp.int32)[None].repeat(2 * pairs, 0)
  small = {k: jnp.asarray(b[k]) for k in ("seg_scores", "seg_mask", "lengths", "pair_weight",
                                          "ref_logps")}

  def naive_sums(h, w):
    logits = jnp.einsum("btd,dv->btv", h, w, preferred_element_type=jnp.float32)
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1)[..., 0]
    return jax.vmap(lambda x, i: jax.ops.segment_sum(x, i, SEGMENTS + 1))(lp, segs)[:, 1:]

  def fused_sums(h, w):  # vocabulary chunks
    return logprobs.segment_logprob_sums(h, w, targets, segs, SEGMENTS, 0, vocab_chunk)

  def seq_chunked_sums(h, w):  # sequence chunks (keeps an fp32 [hidden, vocab] accumulator)
    return logprobs.segment_logprob_sums(h, w, targets, segs, SEGMENTS, seq_chunk)

  def loss(sums_fn):
    def f(h, w):
      policy = sums_fn(h, w).reshape(pairs, 2, SEGMENTS)
      x = dpo2d.PairInputs(policy, small["ref_logps"], small["seg_scores"],
                           small["seg_mask"] > 0, small["lengths"], small["pair_weight"][:, 0])
      return jnp.sum(dpo2d.pair_losses(x, cfg)[0])
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))

  h = jax.ShapeDtypeStruct((2 * pairs, seq, hidden), jnp.dtype(dtype))
  w = jax.ShapeDtypeStruct((hidden, vocab), jnp.dtype(dtype))
  out = {}
  for name, fn in (("fused", fused_sums), ("seq_chunked", seq_chunked_sums),
                   ("naive", naive_sums)):
    stats = loss(fn).lower(h, w).compile().memory_analysis()
    out[f"{name}_temp_bytes"] = int(stats.temp_size_in_bytes)
  out["ratio"] = round(out["naive_temp_bytes"] / out["fused_temp_bytes"], 2)
  out.update(vocab=vocab, seq=seq, pairs=pairs, rows=2 * pairs, hidden=hidden,
             dtype=dtype, vocab_chunk=logprobs.vocab_chunks(vocab, vocab_chunk),
             seq_chunk=seq_chunk)
  return out


# ------------------------------------------------------------- 2. train step


def jax_worker(conn, hf_dir, pairs, seq, mode):
  import functools
  import os
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax
  import jax.numpy as jnp

  from helpsteer_jax import config_base, runtime
  from helpsteer_jax.load import model as loader
  from helpsteer_jax.losses import dpo2d
  from helpsteer_jax.losses.pair_logprobs import preference_loss
  from helpsteer_jax.train import loop
  from helpsteer_jax.train import state as state_lib

  data = config_base.data_config(packing=False, fixed_shape=True)
  config = common.bench_train_config(hf_dir, pairs, seq, lr=LR, betas=BETAS, weight_decay=WD,
                                     clip=CLIP, data=data)
  rt = runtime.setup(config)
  parts = state_lib.split_model(loader.load_model(config, rt, loader.TRAIN), rt.mesh, rt.rules)
  batch = pair_batch(pairs, seq, runtime.model_config(config).vocab_size)
  features = [{k: v[i] for k, v in batch.items()} for i in range(pairs)]
  frozen = None
  if mode == "on_the_fly":
    frozen = (jax.tree.map(jnp.copy, parts.params), parts.param_shardings)
  cfg = dpo2d.PreferenceLossConfig(beta=BETA)
  trainer = loop.Trainer(config, tempfile.mkdtemp(), rt, parts,
                         functools.partial(preference_loss, cfg=cfg, chunk_size=256), features,
                         frozen=frozen)
  arrays, _ = trainer._next_batch()
  stats = {}

  def run_once():
    with jax.set_mesh(rt.mesh):
      trainer.state, metrics = trainer.train_step(trainer.state, arrays, *trainer.frozen)
      jax.block_until_ready(metrics)
    stats["last_loss"] = float(metrics["loss"])

  common.serve(conn, run_once, lambda: stats)


def torch_worker(conn, hf_dir, pairs, seq):
  import torch
  import torch.nn.functional as F
  import transformers

  def load():
    return transformers.LlamaForCausalLM.from_pretrained(hf_dir, attn_implementation="sdpa",
                                                         dtype=torch.float32)
  policy, ref = load().train(), load().eval()
  for p in ref.parameters():
    p.requires_grad_(False)
  opt = common.torch_adamw(policy, LR, BETAS, WD)
  b = pair_batch(pairs, seq, policy.config.vocab_size)
  # TRL concatenated_forward: chosen rows then rejected rows in one batch.
  inputs = torch.from_numpy(b["inputs"].transpose(1, 0, 2).reshape(2 * pairs, seq).astype("int64"))
  labels = torch.from_numpy(b["targets"].transpose(1, 0, 2).reshape(2 * pairs, seq).astype("int64"))
  mask = torch.from_numpy((b["token_segments"].transpose(1, 0, 2).reshape(2 * pairs, seq) > 0))
  stats = {}

  def logps(model):
    logits = model(input_ids=inputs).logits.float()
    per_token = torch.gather(F.log_softmax(logits, -1), 2, labels[..., None])[..., 0]
    return (per_token * mask).sum(-1)

  def run_once():
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
      ref_lp = logps(ref)
    lp = logps(policy)
    logits = (lp[:pairs] - lp[pairs:]) - (ref_lp[:pairs] - ref_lp[pairs:])
    loss = -F.logsigmoid(BETA * logits).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), CLIP)
    opt.step()
    stats["last_loss"] = loss.item()

  common.serve(conn, run_once, lambda: stats)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--pairs", type=int, default=2)
  parser.add_argument("--seq", type=int, default=1024)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--memory-seq", type=int, default=4096)
  parser.add_argument("--memory-vocab", type=int, default=128256)
  parser.add_argument("--on-the-fly", action="store_true",
                      help="also time our step with the reference on the fly (a third process)")
  args = parser.parse_args()

  memory = loss_memory(vocab=args.memory_vocab, seq=args.memory_seq)
  # XLA:CPU runs bf16 matmuls by converting operands to fp32 (and hoists the
  # conversion of the whole weight out of the chunk loop), so bf16 figures on
  # this CPU carry an extra fp32 copy of the head weight; reported for reference.
  memory["bfloat16_on_cpu"] = loss_memory(vocab=args.memory_vocab, seq=args.memory_seq,
                                          dtype="bfloat16")
  print("loss memory:", memory)

  import torch
  import transformers
  torch.manual_seed(0)
  cfg, hf_cfg = common.hf_llama_config("bench_100m")
  with tempfile.TemporaryDirectory() as hf_dir:
    transformers.LlamaForCausalLM(hf_cfg).save_pretrained(hf_dir)
    workers = {"jax_cached": common.Worker(jax_worker, hf_dir, args.pairs, args.seq, "cached")}
    if args.on_the_fly:
      workers["jax_on_the_fly"] = common.Worker(jax_worker, hf_dir, args.pairs, args.seq,
                                                "on_the_fly")
    workers["torch"] = common.Worker(torch_worker, hf_dir, args.pairs, args.seq)
    times, stats = common.run_workers(workers, args.repeats)

  tokens = 2 * args.pairs * args.seq
  tps = {k: tokens / common.median(v) for k, v in times.items()}
  result = {
      "benchmark": "dpo2d_memory", "loss_memory": memory,
      "train_step": {
          "model": "bench_100m", "params": cfg.num_params(), "pairs": args.pairs,
          "seq": args.seq, "dtype": "float32",
          "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
          "ratio": {k: round(v / tps["torch"], 3) for k, v in tps.items() if k != "torch"},
          "peak_rss_mb": {k: s["peak_rss_mb"] for k, s in stats.items()},
          "losses": {k: s["last_loss"] for k, s in stats.items()},
          "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
      },
      "machine": common.machine(),
  }
  common.write_result("dpo2d_memory", result)
  gib = lambda n: f"{n / 2**30:.2f}"
  common.update_doc_table(
      "dpo2d-memory-benchmark",
      ["loss + grad, head only", "fused (vocab chunks) temp GiB", "sequence chunks temp GiB",
       "naive temp GiB", "naive / fused"],
      [[f"vocab {memory['vocab']}, {memory['rows']} x {memory['seq']}, "
        f"hidden {memory['hidden']}, {memory['dtype']}",
        gib(memory["fused_temp_bytes"]), gib(memory["seq_chunked_temp_bytes"]),
        gib(memory["naive_temp_bytes"]), f"{memory['ratio']:.1f}"]])
  ts = result["train_step"]
  rows = []
  for name, label in (("jax_cached", "helpsteer-jax 2D-DPO, cached reference"),
                      ("jax_on_the_fly", "helpsteer-jax 2D-DPO, reference on the fly"),
                      ("torch", "PyTorch + transformers DPO, reference on the fly")):
    if name not in tps:
      continue
    rows.append([label, f"{args.pairs} x 2 x {args.seq}", f"{tps[name]:.0f}",
                 f"{tps[name] / tps['torch']:.2f}", f"{ts['peak_rss_mb'][name]:.0f}"])
  common.update_doc_table(
      "dpo2d-step-benchmark",
      ["Llama 106M, fp32", "pairs x 2 x seq", "tokens/s", "vs PyTorch", "peak RSS MB"], rows)


if __name__ == "__main__":
  main()
