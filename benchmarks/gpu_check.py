"""End-to-end check of the GPU path: platform, cuDNN attention, training, generation.

  python3 benchmarks/gpu_check.py                # on a machine with an NVIDIA GPU
  python3 benchmarks/gpu_check.py --cpu-dry-run  # the same steps on CPU, without cuDNN

Steps, each timed and marked pass/fail (a failing step does not stop the others):

1. platform: the devices JAX sees, their kind, the versions of jax, jaxlib, flax,
   optax and orbax-checkpoint, and the CUDA and cuDNN versions JAX was built with.
2. attention: `models.attention.attention(..., impl="cudnn")` against `impl="xla"` on
   the same random bf16 inputs with two packed segments and right padding (GQA),
   forward and gradients, each also against an fp32 XLA reference; the compiled
   program must hold cuDNN's fused attention. With `--cpu-dry-run` the kernel under
   test is `blockwise`.
3. train: the AC-SFT demo run through the CLI (`configs/acsft.py`, tiny model, demo
   data) in bf16 with cuDNN attention; the loss must fall, the run must export
   `<workdir>/acsft/hf` and its log must show a mesh over GPU devices. Tokens/s are
   the median of the logging windows after the first (which holds the compile).
4. generate: `configs/generate.py` from that run's checkpoint, greedy, a few prompts;
   one row per prompt must be written, on GPU devices. If the run fails with cuDNN
   attention it is retried with the default settings (blockwise, fp32), so that the
   table says which part failed.
5. engine: the serving engine (`inference/engine.py`) on the exported model: warm-up
   (every prompt and row bucket compiled), then greedy requests, compared with the
   batch API (`generator.Generator`, a second engine); runs in a subprocess with a
   time limit.
6. rl: GRPO through the CLI (`configs/rl.py`) from that run's checkpoint, the update in
   bf16 with cuDNN attention, the engine's rollouts, the sampler's log-probs recomputed
   and corrected (`loss.sampler_correction=token_truncate`); every iteration must log a
   finite loss and the mismatch KL, the held-out greedy reward must be scored before
   and after, on GPU devices.

The table is printed last; the results go to `benchmarks/results/gpu_check.json`
(`gpu_check_cpu_dry_run.json` for a dry run) or `--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
MESH_LINE = re.compile(r"mesh (\{[^}]*\}) over (\d+) (\w+) devices")
PROMPTS = [
    {"prompt": "What is 12 plus 7?", "attributes": {"verbosity": 1}},
    {"prompt": "What is the capital of France?", "attributes": {"verbosity": 2}},
    {"prompt": "List three colours.", "attributes": {"verbosity": 4}},
    {"prompt": "What is 6 times 8?", "attributes": {"correctness": 4, "verbosity": 0}},
]


def _env(dry_run: bool) -> dict[str, str]:
  env = dict(os.environ)
  env["JAX_PLATFORMS"] = "cpu" if dry_run else "cuda"
  # Several JAX processes share the GPU one after another (this one stays alive).
  env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
  env["PYTHONUNBUFFERED"] = "1"
  env.setdefault("TPU_LOG_DIR", str(REPO / ".tpu_logs"))
  return env


def _tail(text: str, lines: int = 25) -> str:
  return "\n".join(text.strip().splitlines()[-lines:])


def _run_cli(args: list[str], log: pathlib.Path, env: dict[str, str], timeout: float
             ) -> tuple[int, str]:
  """Runs `python -m helpsteer_jax.main args` in the repository root; (exit code, output)."""
  cmd = [sys.executable, "-m", "helpsteer_jax.main", *args]
  print("$ " + " ".join(cmd), flush=True)
  try:
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    code, out = proc.returncode, proc.stdout + proc.stderr
  except subprocess.TimeoutExpired as e:
    out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    out += (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    code, out = -9, out + f"\n[timed out after {timeout:.0f} s]"
  log.write_text(out, encoding="utf-8")
  return code, out


def _last_error(out: str) -> str:
  """The last line of `out` that names an error (else its last line), shortened."""
  lines = [line.strip() for line in out.strip().splitlines() if line.strip()]
  named = [line for line in lines if re.search(r"(Error|Exception|error:)", line)]
  line = (named or lines or [""])[-1]
  return line if len(line) <= 200 else line[:197] + "..."


def _mesh(out: str) -> dict:
  match = MESH_LINE.search(out)
  if not match:
    return {"mesh": None, "devices": 0, "platform": None}
  return {"mesh": match.group(1), "devices": int(match.group(2)), "platform": match.group(3)}


def _run_task(step: "Step", flags: list[str], log: pathlib.Path, env: dict[str, str],
              timeout: float, run_dir: pathlib.Path) -> tuple[int, str, list[dict]]:
  """A task through the CLI, its command, exit code and mesh in `step.details`;
  (exit code, output, the run's metrics.jsonl records)."""
  from helpsteer_jax.rl import report

  step.details["command"] = "python3 -m helpsteer_jax.main " + " ".join(flags)
  code, out = _run_cli(flags, log, env, timeout)
  step.details.update(exit_code=code, **_mesh(out))
  return code, out, report.read_metrics(run_dir)


class Step:
  """One timed check: `details` for the JSON, `note` for the table."""

  def __init__(self, name: str):
    self.name, self.ok, self.seconds = name, False, 0.0
    self.details: dict = {}
    self.note = ""
    self.error: str | None = None

  def as_dict(self) -> dict:
    return {"name": self.name, "ok": self.ok, "seconds": round(self.seconds, 2),
            "note": self.note, "details": self.details, "error": self.error}


def run_step(name: str, fn, *args) -> Step:
  step = Step(name)
  print(f"\n=== {name}", flush=True)
  start = time.perf_counter()
  try:
    fn(step, *args)
  except Exception as e:  # noqa: BLE001 - recorded, the other steps still run
    step.ok = False
    step.error = f"{type(e).__name__}: {e}"
    traceback.print_exc()
  step.seconds = time.perf_counter() - start
  print(f"--- {name}: {'PASS' if step.ok else 'FAIL'} in {step.seconds:.1f} s"
        + (f" ({step.error})" if step.error else ""), flush=True)
  return step


# ---------------------------------------------------------------------------
# 1. Platform.


def check_platform(step: Step, dry_run: bool) -> None:
  import flax
  import jax
  import jaxlib
  import optax
  import orbax.checkpoint as ocp

  devices = jax.devices()
  d = devices[0]
  info = {"devices": [str(x) for x in devices], "platform": d.platform,
          "device_kind": d.device_kind, "device_count": len(devices),
          "jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
          "optax": optax.__version__, "orbax_checkpoint": getattr(ocp, "__version__", "?"),
          "python": sys.version.split()[0]}
  try:
    from jax._src.lib import cuda_versions
    if cuda_versions is not None:
      info["cudnn"] = cuda_versions.cudnn_get_version()
      info["cuda_runtime"] = cuda_versions.cuda_runtime_get_version()
  except Exception as e:  # noqa: BLE001 - no CUDA plugin (CPU)
    info["cudnn"] = f"unavailable ({type(e).__name__})"
  if hasattr(d, "compute_capability"):
    info["compute_capability"] = d.compute_capability
  try:
    stats = d.memory_stats() or {}
    if "bytes_limit" in stats:
      info["memory_gib"] = round(stats["bytes_limit"] / 2**30, 1)
  except Exception:  # noqa: BLE001 - not every backend reports memory
    pass
  step.details = info
  for k, v in info.items():
    print(f"  {k}: {v}")
  step.ok = d.platform == ("cpu" if dry_run else "gpu")
  step.note = (f"{len(devices)} x {d.device_kind}, jax {info['jax']}, flax {info['flax']}"
               + (f", cuDNN {info['cudnn']}" if isinstance(info.get("cudnn"), int) else ""))
  if not step.ok:
    step.error = f"JAX runs on {d.platform!r}, not on the GPU"


# ---------------------------------------------------------------------------
# 2. Attention kernel against XLA.


def _attention_inputs(b, t, h, k, d, seed=0):
  import jax.numpy as jnp
  import numpy as np

  rng = np.random.RandomState(seed)
  q, kk, v = (jnp.asarray(rng.randn(b, t, n, d), jnp.float32) for n in (h, k, k))
  seg = np.ones((b, t), np.int32)
  seg[0, (2 * t) // 5:] = 2            # two packed segments ...
  seg[0, (9 * t) // 10:] = 0           # ... and padding after them
  if b > 1:
    seg[1, (7 * t) // 10:] = 0         # one segment, right padding
  return q, kk, v, jnp.asarray(seg)


def _rel(a, b, rows=None) -> float:
  import numpy as np
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if rows is not None:
    a, b = a * rows, b * rows
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _time_ms(fn, *args, repeats: int = 20) -> float:
  import jax
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3


def check_attention(step: Step, dry_run: bool) -> None:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from helpsteer_jax.models import attention

  impl = "blockwise" if dry_run else "cudnn"
  shape = dict(b=2, t=256, h=4, k=2, d=64) if dry_run else dict(b=2, t=1024, h=8, k=2, d=128)
  q32, k32, v32, seg = _attention_inputs(**shape)
  info = attention.MaskInfo(seg, seg, 0)
  real = (np.asarray(seg) > 0)[:, :, None, None].astype(np.float64)
  w = jnp.asarray(np.random.RandomState(1).randn(*q32.shape) * real, jnp.float32)

  def fwd(which):
    return jax.jit(lambda q, k, v: attention.attention(q, k, v, info, which, 128))

  def grads(which):
    loss = lambda q, k, v: jnp.sum(attention.attention(q, k, v, info, which, 128)
                                   .astype(jnp.float32) * w)
    return jax.jit(jax.grad(loss, (0, 1, 2)))

  bf = tuple(x.astype(jnp.bfloat16) for x in (q32, k32, v32))
  with jax.default_matmul_precision("highest"):  # fp32 reference (no TF32 on GPU)
    ref_out = fwd("xla")(q32, k32, v32)
    ref_grads = grads("xla")(q32, k32, v32)
  xla_out, xla_grads = fwd("xla")(*bf), grads("xla")(*bf)
  out, gr = fwd(impl)(*bf), grads(impl)(*bf)

  res = {"impl": impl, "shape": shape, "dtype": "bfloat16",
         "segments": "row 0: two packed segments + 10% padding; row 1: 30% padding"}
  res["fwd_rel_vs_xla_bf16"] = _rel(out, xla_out, real)
  res["fwd_rel_vs_fp32"] = _rel(out, ref_out, real)
  res["xla_bf16_fwd_rel_vs_fp32"] = _rel(xla_out, ref_out, real)
  for name, a, b, r in zip("qkv", gr, xla_grads, ref_grads):
    res[f"d{name}_rel_vs_xla_bf16"] = _rel(a, b)
    res[f"d{name}_rel_vs_fp32"] = _rel(a, r)
    res[f"xla_bf16_d{name}_rel_vs_fp32"] = _rel(b, r)
  res["all_finite"] = bool(np.isfinite(np.asarray(out, np.float32)).all()
                           and all(np.isfinite(np.asarray(g, np.float32)).all() for g in gr))
  pad = np.asarray(seg) == 0
  res["padding_rows_finite"] = bool(np.isfinite(np.asarray(out, np.float32)[pad]).all())
  if not dry_run:
    hlo = fwd(impl).lower(*bf).compile().as_text()
    hlo_grad = grads(impl).lower(*bf).compile().as_text()
    res["cudnn_fmha_in_forward"] = "__cudnn$fmha" in hlo
    res["cudnn_fmha_in_backward"] = "__cudnn$fmha" in hlo_grad and "Backward" in hlo_grad
    # Speed at a training-like size: forward + backward, median of 20.
    big = dict(b=4, t=2048, h=16, k=4, d=128)
    bq, bk, bv, bseg = _attention_inputs(**big, seed=2)
    binfo = attention.MaskInfo(bseg, bseg, 0)
    bargs = tuple(x.astype(jnp.bfloat16) for x in (bq, bk, bv))
    for which in ("cudnn", "xla"):
      loss = lambda q, k, v, which=which: jnp.sum(
          attention.attention(q, k, v, binfo, which, 128).astype(jnp.float32))
      res[f"{which}_fwd_bwd_ms"] = _time_ms(jax.jit(jax.grad(loss, (0, 1, 2))), *bargs)
    res["timing_shape"] = big
  step.details = res
  for k, v in res.items():
    print(f"  {k}: {v:.3g}" if isinstance(v, float) else f"  {k}: {v}")
  worst_vs_fp32 = max(v for k, v in res.items()
                      if k.endswith("_rel_vs_fp32") and not k.startswith("xla"))
  worst_xla = max(v for k, v in res.items()
                  if k.endswith("_rel_vs_fp32") and k.startswith("xla"))
  # bf16 rounds to ~4e-3; the kernel must be about as close to fp32 as XLA in bf16.
  checks = {"finite": res["all_finite"], "padding rows finite": res["padding_rows_finite"],
            "close to fp32": worst_vs_fp32 < max(2e-2, 2 * worst_xla),
            "cuDNN in forward": res.get("cudnn_fmha_in_forward", True),
            "cuDNN in backward": res.get("cudnn_fmha_in_backward", True)}
  res["checks"] = checks
  step.ok = all(checks.values())
  step.note = (f"{impl} vs fp32: worst rel {worst_vs_fp32:.1e} (xla bf16 {worst_xla:.1e}),"
               f" vs xla bf16 fwd {res['fwd_rel_vs_xla_bf16']:.1e}")
  if "cudnn_fwd_bwd_ms" in res:
    step.note += (f"; fwd+bwd {res['cudnn_fwd_bwd_ms']:.2f} ms vs xla"
                  f" {res['xla_fwd_bwd_ms']:.2f} ms")
  if not step.ok:
    step.error = "failed: " + ", ".join(k for k, v in checks.items() if not v)


# ---------------------------------------------------------------------------
# 3. Training through the CLI.


def check_train(step: Step, args, env, workdir: pathlib.Path) -> None:
  run_dir = workdir / "acsft"
  impl = "blockwise" if args.cpu_dry_run else "cudnn"
  flags = ["--config=configs/acsft.py", f"--workdir={run_dir}",
           f"--config.model.attention_impl={impl}", "--config.model.dtype=bfloat16",
           f"--config.train.num_steps={args.steps}",
           f"--config.train.log_every={args.log_every}",
           "--config.train.eval_every=0", f"--config.train.save_every={args.steps}",
           f"--config.optimizer.warmup_steps={max(1, args.steps // 10)}"]
  code, out, records = _run_task(step, flags, workdir / "acsft.log", env,
                                 args.train_timeout, run_dir)
  train = [r for r in records if "loss" in r and "tokens_per_s" in r]
  evals = [r for r in records if "eval_loss" in r]
  hf_dir = run_dir / "hf"
  exported = sorted(p.name for p in hf_dir.iterdir()) if hf_dir.is_dir() else []
  steady = [r["tokens_per_s"] for r in train[1:]] or [r["tokens_per_s"] for r in train]
  step.details.update(
      losses={r["step"]: round(r["loss"], 4) for r in train},
      eval_loss=evals[-1]["eval_loss"] if evals else None,
      tokens_per_s_windows=[round(r["tokens_per_s"]) for r in train],
      tokens_per_s=statistics.median(steady) if steady else None,
      step_time_s=statistics.median(r["step_time"] for r in train[1:]) if train[1:] else None,
      mfu=train[-1].get("mfu") if train else None,
      hf_export=exported)
  want = "cpu" if args.cpu_dry_run else "gpu"
  checks = {
      "exit 0": code == 0,
      f"mesh over {want} devices": step.details["platform"] == want,
      "loss fell": len(train) >= 2 and train[-1]["loss"] < train[0]["loss"],
      "hf export": "config.json" in exported and any(n.endswith(".safetensors")
                                                     for n in exported),
  }
  step.details["checks"] = checks
  step.ok = all(checks.values())
  if train:
    step.note = (f"loss {train[0]['loss']:.2f} -> {train[-1]['loss']:.2f} in {args.steps}"
                 f" steps, {step.details['tokens_per_s']:,.0f} tok/s,"
                 f" {step.details['devices']} {step.details['platform']} device(s)")
  if not step.ok:
    step.error = "failed: " + ", ".join(k for k, v in checks.items() if not v)
    if code != 0:
      step.error += f" ({_last_error(out)})"
    print(_tail(out, 40))


# ---------------------------------------------------------------------------
# 4. Generation through the CLI.


def check_generate(step: Step, args, env, workdir: pathlib.Path) -> None:
  prompts = workdir / "prompts.jsonl"
  prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS), encoding="utf-8")
  base = ["--config=configs/generate.py",
          f"--config.init.source={workdir / 'acsft'}", f"--config.input={prompts}",
          f"--config.max_new_tokens={args.max_new_tokens}", "--config.sampling.temperature=0"]
  variants = [("blockwise, fp32 (defaults)", [])]
  if not args.cpu_dry_run:
    variants.insert(0, ("cudnn, bf16", ["--config.model.attention_impl=cudnn",
                                        "--config.model.dtype=bfloat16"]))
  want = "cpu" if args.cpu_dry_run else "gpu"
  attempts = []
  for i, (label, extra) in enumerate(variants):
    out_dir = workdir / f"generate_{i}"
    flags = base + [f"--workdir={out_dir}", *extra]
    start = time.perf_counter()
    code, out = _run_cli(flags, workdir / f"generate_{i}.log", env, args.generate_timeout)
    rows = []
    gen_file = out_dir / "generations.jsonl"
    if gen_file.exists():
      rows = [json.loads(line) for line in gen_file.read_text(encoding="utf-8").splitlines()]
    mesh = _mesh(out)
    ok = (code == 0 and len(rows) == len(PROMPTS) and mesh["platform"] == want
          and all(r.get("finish_reason") in ("stop", "length") for r in rows))
    attempt = {"settings": label, "exit_code": code, "ok": ok, **mesh,
               "seconds": round(time.perf_counter() - start, 1), "rows": len(rows),
               "responses": [r.get("response", "")[:80] for r in rows],
               "finish_reasons": [r.get("finish_reason") for r in rows]}
    if not ok:
      attempt["error"] = _last_error(out)
      attempt["log_tail"] = _tail(out, 30)
      print(attempt["log_tail"])
    attempts.append(attempt)
    if ok:
      break
  step.details["attempts"] = attempts
  step.ok = attempts[0]["ok"]
  last = attempts[-1]
  step.note = (f"{last['rows']} rows ({last['settings']}), {last['devices']}"
               f" {last['platform']} device(s)")
  if not step.ok:
    step.error = f"generation with {attempts[0]['settings']} failed" + (
        f" ({attempts[0].get('error', '')})") + (
        f"; with {last['settings']}: {'ok' if last['ok'] else 'failed too'}"
        if len(attempts) > 1 else "")


# ---------------------------------------------------------------------------
# 5. The serving engine (in a subprocess: it can be stopped if it hangs).


def engine_probe(hf_dir: str, max_new_tokens: int) -> dict:
  import queue

  import jax

  from helpsteer_jax import sharding
  from helpsteer_jax.inference import engine as engine_lib
  from helpsteer_jax.inference import generator, steering
  from helpsteer_jax.models import hf

  tok = hf.load_tokenizer(hf_dir)
  model = hf.load_hf_model(hf_dir)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  # The batch API (one engine, driven in this thread) is the reference for the streaming one.
  gen = generator.Generator(generator.make_engine(model, mesh, tok, max_batch=4,
                                                  max_length=256))
  eng = generator.make_engine(model, mesh, tok, max_batch=4, max_length=256, chunk_steps=8)
  start = time.perf_counter()
  eng.warm_up()
  warm = time.perf_counter() - start
  compiled = eng.compiled_variants
  texts = [steering.make_request(p["prompt"], p["attributes"]).prompt_text() for p in PROMPTS]
  refs = [gen.complete([t], max_new_tokens)[0].text for t in texts]
  eng.start()
  try:
    start = time.perf_counter()
    queues = []
    for t in texts:
      q = queue.Queue()
      eng.submit(engine_lib.DecodeRequest(prompt_ids=gen.encode(t), max_tokens=max_new_tokens,
                                    on_update=q.put))
      queues.append(q)
    finals = []
    for q in queues:
      while True:
        u = q.get(timeout=120)
        if u.finish_reason:
          finals.append(u)
          break
    serve_s = time.perf_counter() - start
  finally:
    eng.stop()
  return {"platform": jax.devices()[0].platform, "warm_up_s": round(warm, 2),
          "compiled_variants": compiled, "compiled_after_requests": eng.compiled_variants,
          "requests": len(finals), "serve_s": round(serve_s, 3),
          "finish_reasons": [u.finish_reason for u in finals],
          "completion_tokens": [u.completion_tokens for u in finals],
          "matches_batch_decoder": [u.text == r for u, r in zip(finals, refs)],
          "stats": dict(eng.stats)}


def check_engine(step: Step, args, env, workdir: pathlib.Path) -> None:
  hf_dir = workdir / "acsft" / "hf"
  if not (hf_dir / "config.json").exists():
    step.error = "no exported model (the train step failed)"
    return
  cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--engine-probe",
         str(hf_dir), f"--max-new-tokens={args.max_new_tokens}"]
  try:
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=args.engine_timeout)
  except subprocess.TimeoutExpired:
    step.error = f"timed out after {args.engine_timeout:.0f} s"
    return
  (workdir / "engine.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
  lines = [line for line in proc.stdout.splitlines() if line.startswith("ENGINE ")]
  if proc.returncode != 0 or not lines:
    step.error = f"exit {proc.returncode}: {_tail(proc.stderr, 3)}"
    print(_tail(proc.stdout + proc.stderr, 30))
    return
  res = json.loads(lines[-1][len("ENGINE "):])
  step.details = res
  want = "cpu" if args.cpu_dry_run else "gpu"
  step.ok = (res["platform"] == want and res["requests"] == len(PROMPTS)
             and res["compiled_after_requests"] == res["compiled_variants"])
  step.note = (f"warm-up {res['warm_up_s']:.1f} s ({res['compiled_variants']} compiled),"
               f" {res['requests']} requests in {res['serve_s']:.2f} s, greedy = batch"
               f" decoder {sum(res['matches_batch_decoder'])}/{res['requests']}")
  if not step.ok:
    step.error = "engine did not serve every request, compiled after warm-up or left the GPU"


# ---------------------------------------------------------------------------
# 6. Online RL through the CLI.


def check_rl(step: Step, args, env, workdir: pathlib.Path) -> None:
  if not (workdir / "acsft" / "checkpoints").is_dir():
    step.error = "no AC-SFT run (the train step failed)"
    return
  run_dir = workdir / "rl"
  impl = "blockwise" if args.cpu_dry_run else "cudnn"
  flags = ["--config=configs/rl.py", f"--workdir={run_dir}",
           f"--config.init.source={workdir / 'acsft'}",
           f"--config.model.attention_impl={impl}", "--config.model.dtype=bfloat16",
           f"--config.train.num_steps={args.rl_steps}",
           f"--config.train.eval_every={args.rl_steps}",
           f"--config.train.save_every={args.rl_steps}",
           "--config.loss.sampler_correction=token_truncate"]
  code, out, records = _run_task(step, flags, workdir / "rl.log", env, args.rl_timeout, run_dir)
  its = [r for r in records if "loss" in r and "reward" in r]
  evals = [r for r in records if "eval_reward" in r]
  finite = lambda v: isinstance(v, (int, float)) and v == v and abs(v) != float("inf")
  step.details.update(
      iterations=len(its),
      reward={r["step"]: round(r["reward"], 4) for r in its},
      loss={r["step"]: round(r["loss"], 5) for r in its},
      mismatch_kl={r["step"]: r.get("mismatch_kl") for r in its},
      mismatch_kl_k3={r["step"]: r.get("mismatch_kl_k3") for r in its},
      is_capped={r["step"]: r.get("is_capped") for r in its},
      eval_reward={r["step"]: round(r["eval_reward"], 4) for r in evals},
      **{f"{phase}_s": statistics.median(r[f"{phase}_s"] for r in its[1:])
         if len(its) > 1 and all(f"{phase}_s" in r for r in its[1:]) else None
         for phase in ("rollout", "update", "iteration")})
  want = "cpu" if args.cpu_dry_run else "gpu"
  checks = {
      "exit 0": code == 0,
      f"mesh over {want} devices": step.details["platform"] == want,
      "every iteration logged": len(its) == args.rl_steps,
      "finite losses": bool(its) and all(finite(r["loss"]) for r in its),
      "mismatch KL logged": bool(its) and all(finite(r.get("mismatch_kl_k3")) for r in its),
      "eval before and after": len(evals) >= 2,
  }
  step.details["checks"] = checks
  step.ok = all(checks.values())
  if its:
    kls = [r["mismatch_kl_k3"] for r in its if finite(r.get("mismatch_kl_k3"))]
    step.note = (f"{len(its)} GRPO iterations, reward {its[0]['reward']:.2f} ->"
                 f" {its[-1]['reward']:.2f}")
    if len(evals) >= 2:
      step.note += (f", held-out {evals[0]['eval_reward']:.3f} ->"
                    f" {evals[-1]['eval_reward']:.3f}")
    if kls:
      step.note += f", mismatch KL (k3) max {max(kls):.1e}"
    if step.details["iteration_s"]:
      step.note += f", {step.details['iteration_s']:.2f} s/iteration"
    step.note += f", {step.details['devices']} {step.details['platform']} device(s)"
  if not step.ok:
    step.error = "failed: " + ", ".join(k for k, v in checks.items() if not v)
    if code != 0:
      step.error += f" ({_last_error(out)})"
    print(_tail(out, 40))


# ---------------------------------------------------------------------------


def table(steps: list[Step]) -> str:
  rows = [("step", "result", "time (s)", "notes")]
  rows += [(s.name, "PASS" if s.ok else "FAIL", f"{s.seconds:.1f}",
            s.note + (f" [{s.error}]" if s.error else "")) for s in steps]
  widths = [max(len(r[i]) for r in rows) for i in range(3)]
  fmt = lambda r: "| " + " | ".join(
      [c.ljust(w) for c, w in zip(r[:3], widths)] + [r[3]]) + " |"
  sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|---|"
  return "\n".join([fmt(rows[0]), sep] + [fmt(r) for r in rows[1:]])


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cpu-dry-run", action="store_true",
                      help="run the same steps on CPU (blockwise instead of cuDNN)")
  parser.add_argument("--workdir", default="", help="run directories (default: a temp dir)")
  parser.add_argument("--json", default="", help="where the results go")
  parser.add_argument("--steps", type=int, default=0, help="training steps (100; dry run 20)")
  parser.add_argument("--log-every", type=int, default=0)
  parser.add_argument("--max-new-tokens", type=int, default=32)
  parser.add_argument("--train-timeout", type=float, default=300)
  parser.add_argument("--generate-timeout", type=float, default=150)
  parser.add_argument("--engine-timeout", type=float, default=180)
  parser.add_argument("--rl-steps", type=int, default=0, help="RL iterations (10; dry run 3)")
  parser.add_argument("--rl-timeout", type=float, default=360)
  parser.add_argument("--skip-engine", action="store_true")
  parser.add_argument("--skip-rl", action="store_true")
  parser.add_argument("--engine-probe", default="", help=argparse.SUPPRESS)
  args = parser.parse_args()

  if args.engine_probe:  # the engine step's subprocess
    sys.path.insert(0, str(REPO))
    print("ENGINE " + json.dumps(engine_probe(args.engine_probe, args.max_new_tokens)))
    return 0

  dry = args.cpu_dry_run
  args.steps = args.steps or (20 if dry else 100)
  args.log_every = args.log_every or (5 if dry else 10)
  args.rl_steps = args.rl_steps or (3 if dry else 10)
  env = _env(dry)
  os.environ.update({k: env[k] for k in ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE")})
  sys.path.insert(0, str(REPO))
  workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="gpu_check_"))
  workdir.mkdir(parents=True, exist_ok=True)
  print(f"mode: {'cpu dry run' if dry else 'gpu'}; workdir: {workdir}", flush=True)

  started = time.perf_counter()
  steps = [run_step("platform", check_platform, dry),
           run_step("attention", check_attention, dry),
           run_step("train", check_train, args, env, workdir),
           run_step("generate", check_generate, args, env, workdir)]
  if not args.skip_engine:
    steps.append(run_step("engine", check_engine, args, env, workdir))
  if not args.skip_rl:
    steps.append(run_step("rl", check_rl, args, env, workdir))

  result = {"mode": "cpu-dry-run" if dry else "gpu",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "device": steps[0].details.get("device_kind"),
            "all_ok": all(s.ok for s in steps),
            "total_seconds": round(time.perf_counter() - started, 1),
            "steps": [s.as_dict() for s in steps]}
  path = pathlib.Path(args.json) if args.json else RESULTS / (
      "gpu_check_cpu_dry_run.json" if dry else "gpu_check.json")
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
  print(f"\nresults: {path}")
  print(f"\n{'all steps passed' if result['all_ok'] else 'SOME STEPS FAILED'}"
        f" ({result['total_seconds']:.0f} s, {result['device']})")
  print(table(steps))
  return 0 if result["all_ok"] else 1


if __name__ == "__main__":
  sys.exit(main())
