"""lm-evaluation-harness through our server next to lm-eval's own transformers backend.

  python benchmarks/lm_eval_vs_hf.py --lm-eval-venv /tmp/lmeval-venv [--model-dir DIR]
      [--limit N] [--smoke]

lm-eval runs from its own virtual environment (its torch and ours do not share
a process), made once with Python 3.11:

  python3.11 -m venv /tmp/lmeval-venv
  /tmp/lmeval-venv/bin/pip install torch==2.13.0   # PyPI's CPU wheel, before lm-eval
  /tmp/lmeval-venv/bin/pip install "lm-eval[hf,api]==0.4.13"  # the hf and API backends

Two small local tasks (written next to the outputs): a multiple-choice one
(loglikelihood requests: acc, acc_norm) and a generate_until one (greedy,
exact_match). The same model directory (`--model-dir`, an HF export; else
SmolLM2-135M-Instruct built offline, `helpsteer_jax.pretrained.smollm2`) is
evaluated twice with the lm_eval CLI: `local-completions` against a
`configs/serve.py` server on it (fp32, `tokenized_requests=True`: lm-eval
sends token ids and reads the prompt tokens' log-probabilities from `echo` +
`logprobs`), and `hf` (transformers, `dtype=float32`). Reports both backends'
scores, the largest difference between their per-request log-likelihoods, and
how many generations differ.

Writes benchmarks/results/lm_eval_vs_hf.json and the table in docs/results.md;
`--smoke` only prints.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
MODEL_NAME = "lm-eval-model"
HEADER = ["model", "task", "metric", "ours (local-completions)", "hf (transformers)",
          "largest loglikelihood difference", "generations differing"]

MC_ROWS = [
    ("What is the capital of France?", ["Berlin", "Paris", "Madrid", "Rome"], 1),
    ("What color is the sky on a clear day?", ["Green", "Red", "Blue", "Yellow"], 2),
    ("How many legs does a spider have?", ["Six", "Eight", "Four", "Ten"], 1),
    ("What is 2 plus 2?", ["Three", "Five", "Four", "Six"], 2),
    ("Which animal is known as the king of the jungle?", ["Lion", "Mouse", "Cow", "Fish"], 0),
    ("What do bees make?", ["Milk", "Honey", "Silk", "Wool"], 1),
    ("Which planet do we live on?", ["Mars", "Venus", "Earth", "Jupiter"], 2),
    ("What is frozen water called?", ["Steam", "Ice", "Sand", "Glass"], 1),
    ("How many days are in a week?", ["Five", "Seven", "Ten", "Twelve"], 1),
    ("What is the opposite of hot?", ["Cold", "Warm", "Big", "Fast"], 0),
    ("Which organ pumps blood through the body?", ["Lung", "Heart", "Liver", "Skin"], 1),
    ("What gas do plants absorb from the air?", ["Oxygen", "Helium", "Carbon dioxide", "Neon"],
     2),
    ("What is the largest ocean on Earth?", ["Atlantic", "Indian", "Arctic", "Pacific"], 3),
    ("Which language is spoken in Spain?", ["Spanish", "German", "Japanese", "Russian"], 0),
    ("How many hours are in a day?", ["Twelve", "Twenty-four", "Sixty", "Ten"], 1),
    ("What do cows drink?", ["Water", "Milk", "Oil", "Juice"], 0),
]
GEN_ROWS = [
    ("The capital of France is", " Paris"), ("Two plus two equals", " four"),
    ("The color of the sky is", " blue"), ("Water freezes at zero degrees", " Celsius"),
    ("The first letter of the alphabet is", " A"), ("Monday, Tuesday,", " Wednesday"),
    ("One, two, three,", " four"), ("The sun rises in the", " east"),
]
TASKS = {
    "tiny_mc": ("multiple_choice", MC_ROWS, """\
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""),
    "tiny_gen": ("generate_until", GEN_ROWS, """\
doc_to_text: "{{question}}"
doc_to_target: "{{target}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 16
  do_sample: false
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
"""),
}


def write_tasks(out: pathlib.Path) -> pathlib.Path:
  """The two tasks' YAML and JSONL files in `out`."""
  out.mkdir(parents=True, exist_ok=True)
  for name, (kind, rows, body) in TASKS.items():
    with open(out / f"{name}.jsonl", "w") as f:
      for row in rows:
        keys = ("question", "choices", "answer") if kind == "multiple_choice" else (
            "question", "target")
        f.write(json.dumps(dict(zip(keys, row))) + "\n")
    (out / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {out / (name + '.jsonl')}\ntest_split: test\noutput_type: {kind}\n" + body)
  return out


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_server(model_dir: pathlib.Path, port: int, workdir: pathlib.Path,
                 max_length: int = 512) -> subprocess.Popen:
  """Our server on `model_dir` in fp32, waited for (up to 20 minutes: it compiles first)."""
  import httpx
  log = workdir / "server.log"
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
  env.pop("HELPSTEER_API_KEY", None)
  out = open(log, "w")
  proc = subprocess.Popen(
      [sys.executable, "-m", "helpsteer_jax.main", "--config=configs/serve.py",
       f"--config.init.source={model_dir}", "--config.model.dtype=float32",
       "--config.model.param_dtype=float32", f"--config.serve.model_name={MODEL_NAME}",
       f"--config.serve.port={port}", f"--config.serve.max_length={max_length}",
       "--config.serve.max_batch=4", "--config.serve.max_tokens=64",
       f"--workdir={workdir / 'serve_workdir'}"],
      cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
  deadline = time.time() + 1200
  while True:
    if proc.poll() is not None:
      raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    try:
      if httpx.get(f"http://127.0.0.1:{port}/stats", timeout=5).status_code == 200:
        return proc
    except httpx.TransportError:
      pass
    if time.time() > deadline:
      proc.kill()
      raise TimeoutError(f"the server did not start; see {log}")
    time.sleep(2)


def lm_eval_command(venv: str | None) -> list[str]:
  """The lm_eval CLI: the venv's, else this interpreter's `lm_eval` module."""
  if venv:
    return [str(pathlib.Path(venv) / "bin" / "lm_eval")]
  return [sys.executable, "-m", "lm_eval"]


def run_lm_eval(cli: list[str], model: str, model_args: str, tasks: pathlib.Path,
                out: pathlib.Path, limit: int | None) -> dict:
  """One lm_eval run; its results JSON and {task: [per-request responses]} from its samples."""
  env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
             TOKENIZERS_PARALLELISM="false", OPENAI_API_KEY="none")
  env.pop("PYTHONPATH", None)
  cmd = [*cli, "--model", model, "--model_args", model_args, "--tasks", ",".join(TASKS),
         "--include_path", str(tasks), "--output_path", str(out), "--log_samples",
         "--batch_size", "1", "--seed", "0"]
  if model == "hf":
    cmd += ["--device", "cpu"]
  if limit:
    cmd += ["--limit", str(limit)]
  print("$", " ".join(cmd), flush=True)
  with open(out.with_suffix(".log"), "w") as log:
    subprocess.run(cmd, check=True, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=out.parent)
  results = max(out.rglob("results_*.json"), key=os.path.getmtime)
  samples = {}
  for task in TASKS:
    path = max(out.rglob(f"samples_{task}_*.jsonl"), key=os.path.getmtime)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    samples[task] = [r["resps"] for r in sorted(rows, key=lambda r: r["doc_id"])]
  return {"results": json.loads(results.read_text())["results"], "samples": samples}


def compare(model_dir: pathlib.Path, workdir: pathlib.Path, venv: str | None,
            limit: int | None = None) -> dict:
  """Both backends' scores on the two tasks and how their responses differ."""
  tasks = write_tasks(workdir / "tasks")
  cli = lm_eval_command(venv)
  port = free_port()
  server = start_server(model_dir, port, workdir)
  try:
    ours = run_lm_eval(cli, "local-completions",
                       f"model={MODEL_NAME},base_url=http://127.0.0.1:{port}/v1/completions,"
                       f"tokenizer={model_dir},tokenized_requests=True,max_retries=1",
                       tasks, workdir / "ours", limit)
  finally:
    server.terminate()
    server.wait(120)
  hf = run_lm_eval(cli, "hf", f"pretrained={model_dir},dtype=float32", tasks,
                   workdir / "hf", limit)
  rows = []
  for task, (kind, _, _) in TASKS.items():
    a, b = ours["samples"][task], hf["samples"][task]
    if kind == "multiple_choice":
      diffs = [abs(float(x[0][0]) - float(y[0][0])) for ra, rb in zip(a, b)
               for x, y in zip(ra, rb)]
      diff, differing = max(diffs), None
    else:
      diff, differing = None, sum(ra != rb for ra, rb in zip(a, b))
    for metric, value in ours["results"][task].items():
      if metric.endswith(",none") and "stderr" not in metric:
        rows.append({"task": task, "metric": metric.split(",")[0], "ours": value,
                     "hf": hf["results"][task][metric], "max_loglikelihood_diff": diff,
                     "generations_differing": differing, "requests": len(a)})
  return {"model_dir": str(model_dir), "limit": limit, "rows": rows}


def table(model: str, rows: list[dict]) -> list[list[str]]:
  def num(x, fmt):
    return "-" if x is None else format(x, fmt)
  return [[model, r["task"], r["metric"], num(r["ours"], ".4f"), num(r["hf"], ".4f"),
           num(r["max_loglikelihood_diff"], ".2e"),
           "-" if r["generations_differing"] is None else
           f"{r['generations_differing']} / {r['requests']}"] for r in rows]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--lm-eval-venv", default=os.environ.get("HELPSTEER_LM_EVAL_VENV"),
                      help="a virtual environment with lm-eval (default: this interpreter's)")
  parser.add_argument("--model-dir", default="", help="an HF export (default: SmolLM2-135M)")
  parser.add_argument("--limit", type=int, default=None, help="documents per task")
  parser.add_argument("--smoke", action="store_true", help="print only")
  args = parser.parse_args()
  sys.path.insert(0, str(REPO))
  if args.model_dir:
    model_dir = pathlib.Path(args.model_dir).resolve()
  else:
    from helpsteer_jax.pretrained import smollm2
    model_dir = smollm2.build_hf_dir()
  with tempfile.TemporaryDirectory() as tmp:
    result = compare(model_dir, pathlib.Path(tmp), args.lm_eval_venv, args.limit)
  print(json.dumps(result, indent=2))
  if args.smoke:
    return
  sys.path.insert(0, str(REPO / "benchmarks"))
  import common
  result["date"] = time.strftime("%Y-%m-%d")
  common.write_result("lm_eval_vs_hf", result)
  name = "SmolLM2-135M-Instruct" if not args.model_dir else model_dir.name
  common.update_doc_table("lm-eval-vs-hf", HEADER, table(name, result["rows"]))


if __name__ == "__main__":
  main()
