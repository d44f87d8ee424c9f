"""One online-RL iteration: our `rl` task vs. TRL's GRPOTrainer and RLOOTrainer (PyTorch CPU).

python benchmarks/rl_iteration.py [--prompts 8 --k 4 --new 64 --iterations 2
                                   --algorithms grpo,rloo,gspo,dapo
                                   --trl-python /tmp/work/venv-trl/bin/python]

GSPO and DAPO run with their own settings on both sides: GSPO is TRL's GRPOTrainer
with `importance_sampling_level="sequence"`, clip 3e-4 / 4e-4, beta 0; DAPO is
`loss_type="dapo"`, clip 0.2 / 0.28, beta 0. Our DAPO also runs dynamic sampling
(and its overlong shaping), which TRL does not have: a dropped group costs us an
extra rollout round, counted in the iteration's time (`dynamic_rounds` in the raw
result).

An iteration samples K completions for each of P prompts with the current
policy, scores them, and takes one optimizer step on the P x K completions.
Both sides train the same ~100M Llama (bench_100m: a random LlamaForCausalLM
saved with transformers' `save_pretrained` by the TRL environment, which our
side imports with `init.source`), with the demo tokenizer (1024 tokens; the
model keeps its 32000-row vocabulary: sampled ids past the tokenizer decode to
nothing on both sides), fp32, on the same P prompts (the SteerLM-formatted
demo prompts; TRL gets them as raw text, no chat template, and both sides'
prompt ids are checked to be equal, BOS included), with the same K, sampling
(temperature 1, no top-p/top-k), reward (benchmarks/rl_reward.py), AdamW
(lr 5e-5 constant, betas 0.9/0.98, no decay, clip 1.0), KL settings (GRPO:
k3 in the loss, beta 0.04; RLOO: KL in the reward, 0.05) and aggregation
(GRPO per sequence, RLOO per token). Every completion runs to `--new`
tokens: our engine gets no stop ids or stop strings, TRL's generate gets
min_new_tokens = max_new_tokens (EOS suppressed); the script checks it.

Each side and algorithm runs in its own process, one after another: ours
(`RLTrainer.run_iteration`, this file with `--side ours`) and TRL's
(benchmarks/rl_iteration_trl.py in the TRL environment), each after an
untimed warm-up iteration (compiles, first step). Reports per-iteration
seconds (rollout = sampling alone; update = the optimizer step(s); the rest
is rewards, reference and old log-probs, advantages), rollout and update
tokens/s and each process's peak RSS. Writes benchmarks/results/rl_iteration.json
and the table in docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import common

TRL_PYTHON = "/tmp/work/venv-trl/bin/python"
TRL_WORKER = pathlib.Path(__file__).resolve().parent / "rl_iteration_trl.py"
LR, B1, B2, EPS, CLIP = 5e-5, 0.9, 0.98, 1e-8, 1.0
GRPO_BETA, RLOO_KL, EPS_CLIP = 0.04, 0.05, 0.2
CHUNK = 64  # train.loss_chunk_size and the attention block: seq_len is a multiple


# -- our side (its own process) ----------------------------------------------------------


def _our_config(spec: dict):
  from helpsteer_jax import config_base
  from helpsteer_jax.config_sections import train_config
  from helpsteer_jax.configs import rl as rl_config
  config = rl_config.get_config()
  config.algorithm = spec["algorithm"]
  config.model = config_base.model_section("bench_100m", attention_block_size=CHUNK)
  config.init.source, config.init.source = spec["hf_dir"], ""
  config.mesh = config_base.mesh_config(1, 1, 1)
  rows = spec["prompts"] * spec["k"]
  config.train = train_config(num_steps=1 + spec["iterations"], global_batch=rows,
                              micro_batch=rows, seq_len=spec["seq_len"], log_every=1,
                              eval_every=0, save_every=10**9, export_hf=False,
                              loss_chunk_size=CHUNK)
  config.optimizer.update(lr=LR, b1=B1, b2=B2, eps=EPS, grad_clip=CLIP, weight_decay=0.0,
                          schedule="constant", warmup_steps=0)
  config.rollout.update(prompts_per_iteration=spec["prompts"], samples_per_prompt=spec["k"],
                        max_new_tokens=spec["max_new_tokens"], temperature=spec["temperature"],
                        top_p=1.0, top_k=0, stop_strings=())
  if spec["algorithm"] in ("grpo", "rloo"):
    config.loss.update(beta=GRPO_BETA, kl_coef=RLOO_KL, eps_low=EPS_CLIP, eps_high=EPS_CLIP)
  # gspo and dapo keep their own settings (no KL; clip 3e-4 / 4e-4, 0.2 / 0.28): TRL's
  # side configures the same (rl_iteration_trl.py).
  config.reward.normalize = "none"
  config.scorer.source = "rl_reward:make_scorer"
  for name in config.scorer.weights:
    config.scorer.weights[name] = 1.0 if name == "helpfulness" else 0.0
  config.prompts.eval_limit = 1
  return config


def run_ours(spec: dict, result_path: str) -> None:
  import resource

  import jax

  from helpsteer_jax.inference import generator, steering
  from helpsteer_jax.inference.engine import Engine
  from helpsteer_jax.rl import settings
  from helpsteer_jax.rl.trainer import Prompt, RLTrainer
  from helpsteer_jax.runs import policy
  from helpsteer_jax.runs import setup as setup_lib
  from helpsteer_jax.scoring import rewards as scoring_rewards
  from helpsteer_jax.scoring.load import load_scorer
  from helpsteer_jax.tasks import rl as rl_task

  config = _our_config(spec)
  workdir = tempfile.mkdtemp(prefix="rl_iteration_")
  s = settings.read(config)
  setup = setup_lib.prepare(config, workdir)
  rt, tokenizer = setup.rt, setup.tokenizer
  source = policy.source_spec(config)
  attributes = (steering.run_attributes(config, source)
                if source.attributes or config.steer_attributes else {})
  scorer = load_scorer(config.scorer, rt)
  weights = scoring_rewards.weight_vector(config.scorer.weights.to_dict())
  parts, fresh_adapters = policy.load_policy(config, rt)
  reference = rl_task._reference(config, s, parts, rt, fresh_adapters)

  def make_engine(model):  # no EOS, no stop ids or strings: every row runs to the limit
    return Engine(model, rt.mesh, tokenizer, rules=rt.rules, max_batch=s.rows,
                  max_length=config.train.seq_len, pad_id=int(tokenizer.pad_token_id or 0))

  trainer = RLTrainer(config, workdir, rt, parts, s, make_engine, scorer, weights, [], [],
                      reference)
  encode = generator.Generator(trainer.engine, add_bos=config.rollout.add_bos).encode
  requests = [steering.make_request(t, attributes, config.prompts.system)
              for t in spec["raw_prompts"]]
  trainer.train_prompts = [Prompt(r, encode(r.prompt_text())) for r in requests]
  if [p.ids for p in trainer.train_prompts] != spec["prompt_ids"]:
    raise SystemExit("our prompt ids differ from the ones given to TRL")

  start = time.perf_counter()
  warm = trainer.run_iteration(0)
  warm_s = time.perf_counter() - start
  compiled = trainer.engine.compiled_variants
  compiles = []  # XLA compilations inside the timed iterations (their seconds)

  def on_event(event, seconds, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(round(seconds, 2))

  jax.monitoring.register_event_duration_secs_listener(on_event)
  jax.config.update("jax_log_compiles", True)  # which function, on stderr
  iterations = [trainer.run_iteration(i) for i in range(1, 1 + spec["iterations"])]
  for m in [warm, *iterations]:
    if m["truncated"] != 1.0 or m["response_length"] != spec["max_new_tokens"]:
      raise SystemExit(f"a completion ended early: {m}")
  trainer.close()
  peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  keys = ("rollout_s", "score_s", "update_s", "iteration_s", "rollout_tokens_per_s",
          "update_tokens_per_s", "response_length", "reward", "kl", "loss", "dynamic_rounds")
  result = {"warm_up_s": round(warm_s, 2),
            "iterations": [{k: m[k] for k in keys if k in m} for m in iterations],
            "engine_compiles_after_warm_up": trainer.engine.compiled_variants - compiled,
            "xla_compiles_after_warm_up_s": compiles,
            "rows": s.rows, "completion_tokens": s.rows * s.max_new_tokens,
            "peak_rss_mb": round(peak_mb, 1), "jax": jax.__version__}
  pathlib.Path(result_path).write_text(json.dumps(result, indent=2))


# -- the driver ---------------------------------------------------------------------------


def _bench_shape() -> dict:
  from helpsteer_jax.models import catalog
  cfg = catalog.model_config("bench_100m")
  return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
              intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
              num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
              max_position_embeddings=4096, tie_word_embeddings=False)


def _prompts(tok_dir: pathlib.Path, n: int) -> tuple[list[str], list[str], list[list[int]]]:
  """The raw demo prompts, their SteerLM prompt texts (BOS as text, for TRL) and ids."""
  from transformers import AutoTokenizer

  from helpsteer_jax.data.demo import rows
  from helpsteer_jax.inference import steering
  raw = rows.heldout_prompts()[:n]
  tokenizer = AutoTokenizer.from_pretrained(tok_dir)
  texts = [tokenizer.bos_token + steering.make_request(t, {}).prompt_text() for t in raw]
  ids = [list(tokenizer(text=t, add_special_tokens=False)["input_ids"]) for t in texts]
  return raw, texts, ids


def _run(cmd: list[str], timeout: int) -> None:
  print("+", " ".join(cmd), flush=True)
  start = time.perf_counter()
  subprocess.run(cmd, check=True, timeout=timeout)
  print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)


def _summary(side: str, algorithm: str, raw: dict, spec: dict) -> dict:
  """Mean seconds and tokens/s over the timed iterations of one side."""
  t = spec["max_new_tokens"]
  rows = spec["prompts"] * spec["k"]
  prompt_tokens = sum(len(i) for i in spec["prompt_ids"]) * spec["k"]
  if side == "ours":
    its = [{"rollout_s": m["rollout_s"], "update_s": m["update_s"],
            "iteration_s": m["iteration_s"]} for m in raw["iterations"]]
    extra = {"engine_compiles_after_warm_up": raw["engine_compiles_after_warm_up"],
             "xla_compiles_after_warm_up_s": raw["xla_compiles_after_warm_up_s"],
             "warm_up_s": raw["warm_up_s"]}
  else:
    steps = raw["steps"][1:]
    for st in raw["steps"]:
      if st["completion_tokens"] != rows * t or st["completion_lengths"] != [t]:
        raise SystemExit(f"a TRL completion ended early: {st}")
      if st["prompt_tokens"] != prompt_tokens:
        raise SystemExit(f"TRL's prompt tokens differ: {st}")
    its = [{"rollout_s": st["generate_s"], "update_s": st["step_s"] - st["experience_s"],
            "iteration_s": st["step_s"]} for st in steps]
    extra = {"warm_up_s": round(raw["steps"][0]["step_s"], 2),
             "padded_prompt_len": steps[0]["padded_prompt_len"]}
  mean = {k: statistics.mean(i[k] for i in its) for k in its[0]}
  mean["other_s"] = mean["iteration_s"] - mean["rollout_s"] - mean["update_s"]
  return {"side": side, "algorithm": algorithm,
          **{k: round(v, 3) for k, v in mean.items()},
          "rollout_tokens_per_s": round(rows * t / mean["rollout_s"], 1),
          # the prompt and completion tokens the update trains on
          "update_tokens_per_s": round((prompt_tokens + rows * t) / mean["update_s"], 1),
          "peak_rss_mb": raw["peak_rss_mb"],
          "seconds": [{k: round(v, 3) for k, v in i.items()} for i in its], **extra}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--side", choices=("ours",), help=argparse.SUPPRESS)
  parser.add_argument("--spec", help=argparse.SUPPRESS)
  parser.add_argument("--out", help=argparse.SUPPRESS)
  parser.add_argument("--prompts", type=int, default=8)
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--new", type=int, default=64)
  parser.add_argument("--iterations", type=int, default=2)
  parser.add_argument("--algorithms", default="grpo,rloo")
  parser.add_argument("--trl-python", default=TRL_PYTHON)
  parser.add_argument("--timeout", type=int, default=900, help="seconds per side")
  parser.add_argument("--workdir", default="", help="keep the model and each side's raw"
                      " result here; a rerun skips the sides whose result is there")
  args = parser.parse_args()

  if args.side == "ours":
    common.setup_cpu_process()
    run_ours(json.loads(pathlib.Path(args.spec).read_text()), args.out)
    return

  sys.path.insert(0, str(common.REPO))
  from helpsteer_jax.data.demo.tokenizer import build_demo_tokenizer
  if args.workdir:
    tmp = pathlib.Path(args.workdir)
    tmp.mkdir(parents=True, exist_ok=True)
  else:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rl_iteration_"))
  try:
    tok_dir = build_demo_tokenizer(tmp / "tokenizer")
    hf_dir = tmp / "model"
    shape = _bench_shape()
    if not (hf_dir / "tokenizer.json").exists():
      model_spec = tmp / "model_spec.json"
      model_spec.write_text(json.dumps({"hf_config": {**shape, "bos_token_id": 1,
                                                      "eos_token_id": 2, "pad_token_id": 0}}))
      _run([args.trl_python, str(TRL_WORKER), "make-model", str(model_spec), str(hf_dir)], 300)
      for f in tok_dir.iterdir():
        shutil.copy(f, hf_dir / f.name)
    raw_prompts, texts, ids = _prompts(tok_dir, args.prompts)
    seq_len = -(-(max(len(i) for i in ids) + args.new) // CHUNK) * CHUNK
    base = dict(hf_dir=str(hf_dir), prompts=args.prompts, k=args.k, max_new_tokens=args.new,
                iterations=args.iterations, temperature=1.0, seq_len=seq_len,
                raw_prompts=raw_prompts, prompt_texts=texts, prompt_ids=ids, lr=LR, b1=B1,
                b2=B2, eps=EPS, grad_clip=CLIP, beta=GRPO_BETA, kl_coef=RLOO_KL,
                eps_clip=EPS_CLIP)
    results = []
    for algorithm in args.algorithms.split(","):
      spec = dict(base, algorithm=algorithm)
      spec_path = tmp / f"spec_{algorithm}.json"
      spec_path.write_text(json.dumps(spec))
      for side in ("ours", "trl"):
        out = tmp / f"{side}_{algorithm}.json"
        cmd = ([sys.executable, __file__, "--side", "ours", "--spec", str(spec_path),
                "--out", str(out)] if side == "ours" else
               [args.trl_python, str(TRL_WORKER), "run", str(spec_path), str(out)])
        if not out.exists():
          _run(cmd, args.timeout)
        raw = json.loads(out.read_text())
        results.append(_summary(side, algorithm, raw, spec))
        print(json.dumps(results[-1]), flush=True)
        if side == "trl":
          versions = {k: raw[k] for k in ("torch", "transformers", "trl", "torch_threads")}
  finally:
    if not args.workdir:
      shutil.rmtree(tmp, ignore_errors=True)

  by = {(r["side"], r["algorithm"]): r for r in results}
  for r in results:
    if r["side"] == "ours":
      r["iteration_ratio_ours_over_trl"] = round(
          r["iteration_s"] / by["trl", r["algorithm"]]["iteration_s"], 3)
  prompt_lens = [len(i) for i in ids]
  machine = common.machine()
  machine.update({f"trl_env_{k}": v for k, v in versions.items()})
  result = {"benchmark": "rl_iteration", "model": "bench_100m", "vocab_size": shape["vocab_size"],
            "tokenizer_size": 1024, "dtype": "float32", "prompts": args.prompts, "k": args.k,
            "max_new_tokens": args.new, "seq_len": seq_len, "timed_iterations": args.iterations,
            "prompt_tokens": prompt_lens, "rows": results, "machine": machine}
  common.write_result("rl_iteration", result)
  header = ["side", "rollout s", "update s", "other s", "iteration s", "rollout tok/s",
            "update tok/s", "peak RSS MB", "iteration ours / TRL"]
  table = []
  for r in results:
    name = f"{'helpsteer-jax' if r['side'] == 'ours' else 'TRL'} {r['algorithm']}"
    ratio = r.get("iteration_ratio_ours_over_trl")
    table.append([name, f"{r['rollout_s']:.2f}", f"{r['update_s']:.2f}", f"{r['other_s']:.2f}",
                  f"{r['iteration_s']:.2f}", f"{r['rollout_tokens_per_s']:.0f}",
                  f"{r['update_tokens_per_s']:.0f}", f"{r['peak_rss_mb']:.0f}",
                  f"{ratio:.2f}" if ratio is not None else ""])
  print("| " + " | ".join(header) + " |")
  for row in table:
    print("| " + " | ".join(row) + " |")
  common.update_doc_table("rl-iteration-benchmark", header, table)


if __name__ == "__main__":
  main()
