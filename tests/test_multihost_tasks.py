"""Annotate, evaluate_rm, generate, evaluate_generation, build_2d and the 2D-DPO
reference pass with two
processes (4 CPU devices each) write exactly the files of one process with 8.

Both runs use the mesh data=2 fsdp=4 tensor=1 and shard batches over (data,
fsdp), so every row is computed on one device by the same program and per-row
results are bitwise equal. Each two-process test also checks that the work
was split (the per-process counts every task logs on process 0, or the calls
a host-side scorer recorded per process) and that process 1 wrote nothing
under the workdir (tests/write_audit records the files each process writes).
The kill tests SIGKILL one process mid-way; the survivor exits non-zero (75
when process 1 is lost) and a two-process rerun resumes and ends with the
same files.
"""

import json
import os
import pathlib
import re
import signal
import time

import numpy as np
import pytest
from mt_bench_utils import JUDGE, QUESTIONS, StubJudge, write_mt_bench

from helpsteer_jax.data.demo import rows as demo
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer
from helpsteer_jax.models import builder, catalog, hf
from helpsteer_jax.scoring import reward_model

from cli_utils import run_main
from conftest import REPO_ROOT
from fake_scorer import CALLS_DIR_ENV
from multiprocess import Group

pytestmark = [pytest.mark.multihost, pytest.mark.one_stack("3.11", reason=(
    "the tasks' multi-process splits; the 3.12 stack runs the fault tests"))]

TESTS = REPO_ROOT / "tests"
MODEL = ("--config.model.hidden_size=64", "--config.model.intermediate_size=128",
         "--config.model.num_layers=2", "--config.model.num_heads=4",
         "--config.model.num_kv_heads=2")
MESH = ("--config.mesh.data=2", "--config.mesh.fsdp=4", "--config.mesh.tensor=1")
ANNOTATE_ROWS = 120
PROMPTS = 40
REFERENCE_PAIRS = 256  # 32 batches of 8: time to kill a process between parts


def _pythonpath(*dirs: pathlib.Path) -> str:
  return os.pathsep.join([*map(str, dirs), *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
  root = tmp_path_factory.mktemp("multihost_inputs")
  rng = np.random.default_rng(0)
  tokenizer = demo_tokenizer.build_demo_tokenizer(root / "tokenizer")
  # The attribute model: a random HF backbone of MODEL's shape and a head file.
  shape = {flag.split(".")[-1].split("=")[0]: int(flag.split("=")[1]) for flag in MODEL}
  hf.save_hf_model(builder.create(catalog.model_config("tiny", **shape), seed=0),
                   root / "backbone", dtype="float32", tokenizer=str(tokenizer))
  reward_model.save_head(root / "head.npz", {
      "kernel": rng.normal(size=(64, 9)).astype(np.float32),
      "bias": np.full(9, 2.0, np.float32)})
  rows = demo.demo_rows(ANNOTATE_ROWS, seed=3)
  (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  prompts = [{"prompt": r["prompt"], "id": i} for i, r in enumerate(demo.demo_rows(PROMPTS, 4))]
  (root / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
  return {"root": root, "head": root / "head.npz", "rows": root / "rows.jsonl",
          "prompts": root / "prompts.jsonl", "tokenizer": tokenizer,
          "backbone": root / "backbone"}


# ------------------------------------------------------------------ harness


def _single(*args: str):
  """A one-process run with 8 devices."""
  return run_main(*args, devices=8, env={"PYTHONPATH": _pythonpath(TESTS)})


class TwoProcesses:
  """Two processes of one job, each with its own record of the files it wrote."""

  def __init__(self, tmp_path: pathlib.Path, *args: str, heartbeat_timeout: int = 30):
    self.heartbeat_timeout = heartbeat_timeout
    self.audit = tmp_path / f"audit_{time.monotonic_ns()}"
    self.audit.mkdir()
    env = {"PYTHONPATH": _pythonpath(TESTS / "write_audit", TESTS),
           "HELPSTEER_WRITE_AUDIT": str(self.audit)}
    self.group = Group(*args, env=env, heartbeat_timeout=heartbeat_timeout)

  def wait(self, check: bool = True):
    results = self.group.wait(600)
    if check:
      for i, r in enumerate(results):
        assert r.returncode == 0, f"process {i}: exit {r.returncode}\n{r.stderr[-4000:]}"
    return results

  def kill_when(self, victim: int, ready, timeout: float = 300):
    """SIGKILLs process `victim` once `ready()`.

    Returns every process's result and whether the survivor hung (it is
    killed after the heartbeat timeout and a margin).
    """
    deadline = time.monotonic() + timeout
    while not ready():
      for i, p in enumerate(self.group.procs):
        assert p.poll() is None, (f"process {i} ended ({p.returncode}) before the kill:\n"
                                  f"{self.group.stderr(i)[-4000:]}")
      assert time.monotonic() < deadline, "the work never got far enough to kill a process"
      time.sleep(0.05)
    self.group.signal(victim, signal.SIGKILL)
    survivor = self.group.procs[1 - victim]
    deadline = time.monotonic() + self.heartbeat_timeout + 20
    while survivor.poll() is None and time.monotonic() < deadline:
      time.sleep(0.2)
    hung = survivor.poll() is None
    if hung:
      survivor.kill()
    return self.wait(check=False), hung

  def written(self, i: int, root: pathlib.Path) -> set[str]:
    """Files under `root` that process i opened for writing, renamed or removed."""
    log = self.audit / f"{self.group.procs[i].pid}.log"
    paths = log.read_text().splitlines() if log.exists() else []
    root = os.path.abspath(root)
    return {os.path.relpath(p, root) for p in paths if p.startswith(root + os.sep)
            and not os.path.basename(p).startswith(".write_probe_")}


def _run_two(tmp_path, *args: str):
  run = TwoProcesses(tmp_path, *args)
  return run, run.wait()


def _split(stderr: str, what: str) -> list[int]:
  """The per-process counts a task logged on process 0 (the last such line)."""
  found = re.findall(rf"{re.escape(what)} per process: \[([\d, ]+)\]", stderr)
  assert found, f"no {what!r} line in:\n{stderr[-3000:]}"
  return [int(x) for x in found[-1].split(",")]


def _assert_split(counts: list[int], total: int) -> None:
  assert len(counts) == 2 and min(counts) > 0 and sum(counts) == total, counts


def _assert_same(a: pathlib.Path, b: pathlib.Path, *names: str) -> None:
  for name in names:
    assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _lines(path: pathlib.Path) -> int:
  return path.read_bytes().count(b"\n") if path.exists() else 0


def _killed_and_rerun(tmp_path, args, victim: int, progress, at_least: int,
                      root: pathlib.Path):
  """Kills process `victim` once `progress()` reaches `at_least`, then reruns both.

  Checks that process 1 wrote nothing under `root` in either run; returns the
  killed run's results, whether its survivor hung, the progress left by the
  killed run and the rerun's results.
  """
  killed = TwoProcesses(tmp_path, *args, heartbeat_timeout=10)
  stopped, hung = killed.kill_when(victim, lambda: progress() >= at_least)
  done = progress()
  run, results = _run_two(tmp_path, *args)
  assert killed.written(1, root) == run.written(1, root) == set()
  return stopped, hung, done, results


def _assert_survivor_stopped(results, victim: int, hung: bool) -> None:
  """Checked after the rerun, so that a hung survivor still lets the resume be tested."""
  # A failed collective raises in the survivor; the entry point then leaves
  # the verdict to the peer watchdog instead of the interpreter's teardown,
  # which would block inside the runtime.
  assert not hung, f"process {victim} was killed and the survivor hung"
  assert results[victim].returncode == -signal.SIGKILL
  survivor = results[1 - victim]
  assert survivor.returncode != 0, survivor.stderr[-3000:]
  if victim == 1:  # the peer watchdog; losing process 0 makes JAX end the survivor
    assert survivor.returncode == 75, survivor.stderr[-3000:]
    assert "rerun every process" in survivor.stderr.strip().splitlines()[-1]


# ------------------------------------------------------------------ annotate


def _scorer(inputs) -> tuple[str, ...]:
  """The attribute model of annotate, evaluate_rm and build_2d: the backbone + head file."""
  return (f"--config.scorer.source={inputs['backbone']}",
          f"--config.scorer.head={inputs['head']}", "--config.scorer.batch_size=8")


def _annotate(inputs, workdir) -> tuple[str, ...]:
  return ("--config=configs/annotate.py", *MESH, *_scorer(inputs),
          f"--config.data.input_path={inputs['rows']}",
          "--config.data.chunk_rows=8", f"--workdir={workdir}")


@pytest.fixture(scope="module")
def annotate_single(inputs, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("annotate_single")
  proc = _single(*_annotate(inputs, workdir))
  return workdir, _split(proc.stderr, "annotate: sequences scored")[0]


def test_annotate_two_processes_write_the_one_process_file(inputs, annotate_single, tmp_path):
  single, scored = annotate_single
  run, results = _run_two(tmp_path, *_annotate(inputs, tmp_path / "w"))
  _assert_same(single, tmp_path / "w", "annotated.jsonl", "annotate_summary.json")
  _assert_split(_split(results[0].stderr, "annotate: sequences scored"), scored)
  assert run.written(0, tmp_path / "w") == {"annotated.jsonl", "annotate_summary.json"}
  assert run.written(1, tmp_path / "w") == set()
  assert "annotate:" in results[0].stdout and "annotate:" not in results[1].stdout


def test_annotate_resumes_after_process_1_is_killed(inputs, annotate_single, tmp_path):
  single, _ = annotate_single
  out = tmp_path / "w" / "annotated.jsonl"
  stopped, hung, written, _ = _killed_and_rerun(
      tmp_path, _annotate(inputs, tmp_path / "w"), 1, lambda: _lines(out), 16, tmp_path / "w")
  assert 16 <= written < ANNOTATE_ROWS
  _assert_same(single, tmp_path / "w", "annotated.jsonl")
  assert json.loads((tmp_path / "w" / "annotate_summary.json").read_text())[
      "already_written"] == written
  _assert_survivor_stopped(stopped, 1, hung)


# --------------------------------------------------------------- evaluate_rm


def _evaluate(inputs, workdir) -> tuple[str, ...]:
  return ("--config=configs/evaluate_rm.py", *MESH, *_scorer(inputs),
          "--config.data.demo_train_rows=8", "--config.data.demo_validation_rows=40",
          f"--workdir={workdir}")


def test_evaluate_rm_two_processes_write_the_one_process_report(inputs, tmp_path):
  proc = _single(*_evaluate(inputs, tmp_path / "single"))
  scored = _split(proc.stderr, "evaluate_rm: sequences scored")[0]
  run, results = _run_two(tmp_path, *_evaluate(inputs, tmp_path / "w"))
  _assert_same(tmp_path / "single", tmp_path / "w", "rm_report.json", "rm_attributes.png")
  _assert_split(_split(results[0].stderr, "evaluate_rm: sequences scored"), scored)
  assert {"rm_report.json", "rm_attributes.png"} <= run.written(0, tmp_path / "w")
  assert run.written(1, tmp_path / "w") == set()


# ------------------------------------------------------------------ generate


def _generate(inputs, workdir) -> tuple[str, ...]:
  """Sampling (seeds matter) and best of 2 (the demo-rule scores are split too)."""
  return ("--config=configs/generate.py", *MODEL, *MESH,
          f"--config.tokenizer={inputs['tokenizer']}", f"--config.input={inputs['prompts']}",
          "--config.batch_size=8", "--config.max_new_tokens=16", "--config.max_length=128",
          "--config.steer_attributes=helpsteer", "--config.sampling.temperature=0.8",
          "--config.sampling.top_k=40", "--config.best_of_n.n=2", f"--workdir={workdir}")


@pytest.fixture(scope="module")
def generate_single(inputs, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("generate_single")
  proc = _single(*_generate(inputs, workdir))
  assert _split(proc.stderr, "generate: rows decoded") == [2 * PROMPTS]  # best of 2
  return workdir


def test_generate_two_processes_write_the_one_process_file(inputs, generate_single, tmp_path):
  run, results = _run_two(tmp_path, *_generate(inputs, tmp_path / "w"))
  _assert_same(generate_single, tmp_path / "w", "generations.jsonl")
  _assert_split(_split(results[0].stderr, "generate: rows decoded"), 2 * PROMPTS)
  assert run.written(0, tmp_path / "w") == {"generations.jsonl"}
  assert run.written(1, tmp_path / "w") == set()


def test_generate_resumes_after_process_0_is_killed(inputs, generate_single, tmp_path):
  out = tmp_path / "w" / "generations.jsonl"
  stopped, hung, written, results = _killed_and_rerun(
      tmp_path, _generate(inputs, tmp_path / "w"), 0, lambda: _lines(out), 8, tmp_path / "w")
  assert 8 <= written < PROMPTS
  _assert_same(generate_single, tmp_path / "w", "generations.jsonl")
  assert f"({written} already answered)" in results[0].stdout
  _assert_survivor_stopped(stopped, 0, hung)


# ------------------------------------------------------------------ evaluate_generation


def _evaluate_generation(inputs, judge_url, workdir) -> tuple[str, ...]:
  return ("--config=configs/evaluate_generation.py", *MODEL, *MESH,
          f"--config.tokenizer={inputs['tokenizer']}",
          f"--config.mt_bench.dir={write_mt_bench(inputs['root'] / 'mt_bench')}",
          f"--config.judge.base_url={judge_url}", f"--config.judge.model={JUDGE}",
          "--config.batch_size=8", "--config.max_new_tokens=16", "--config.max_length=256",
          "--config.model_id=tiny", f"--workdir={workdir}")


def _without_time(path: pathlib.Path) -> list[dict]:
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  return [{k: v for k, v in r.items() if k != "tstamp"} for r in rows]


def test_evaluate_generation_two_processes_judge_once_on_process_0(inputs, tmp_path):
  """Answers and judgments equal a one-process run's; the LLM judge is asked once per
  answer turn, by process 0 only, and process 1 writes nothing."""
  judge = StubJudge()
  judge.broken = False
  try:
    _single(*_evaluate_generation(inputs, judge.url, tmp_path / "single"))
    judgments = 2 * len(QUESTIONS)
    assert len(judge.requests) == judgments
    run, results = _run_two(tmp_path, *_evaluate_generation(inputs, judge.url, tmp_path / "w"))
    assert len(judge.requests) == 2 * judgments
  finally:
    judge.stop()
  for name in ("answers.jsonl", "judgments.jsonl"):
    assert _without_time(tmp_path / "single" / name) == _without_time(tmp_path / "w" / name)
  assert run.written(1, tmp_path / "w") == set()
  assert {"answers.jsonl", "judgments.jsonl", "judge_cache.jsonl", "mt_bench.json"} <= \
      run.written(0, tmp_path / "w")
  assert "########## Average ##########" in results[0].stdout


# ------------------------------------------------------------------ build_2d


def _build_2d_fake(calls: pathlib.Path, workdir) -> tuple[str, ...]:
  calls.mkdir(parents=True, exist_ok=True)
  os.environ[CALLS_DIR_ENV] = str(calls)  # where make_recording logs, in every process
  return ("--config=configs/build_2d.py", "--config.scorer.source=fake_scorer:make_recording",
          "--config.data.demo_rows=24", f"--workdir={workdir}")


def _calls(path: pathlib.Path) -> list[int]:
  return [int(n) for n in path.read_text().split()] if path.exists() else []


def _assert_same_build_2d(a: pathlib.Path, b: pathlib.Path) -> None:
  _assert_same(a, b, "helpsteer_2d.jsonl")
  summaries = [json.loads((d / "build_2d.json").read_text()) for d in (a, b)]
  for s in summaries:
    s.pop("output")
  assert summaries[0] == summaries[1]


def test_build_2d_splits_a_host_side_scorer_across_processes(tmp_path):
  _single(*_build_2d_fake(tmp_path / "calls_single", tmp_path / "single"))
  texts = sum(_calls(tmp_path / "calls_single" / "calls_0.txt"))
  run, results = _run_two(tmp_path, *_build_2d_fake(tmp_path / "calls", tmp_path / "w"))
  _assert_same_build_2d(tmp_path / "single", tmp_path / "w")
  shares = [sum(_calls(tmp_path / "calls" / f"calls_{i}.txt")) for i in (0, 1)]
  assert shares == [-(-texts // 2), texts // 2]  # contiguous halves, each scored once
  assert _split(results[0].stderr, "build_2d: texts scored") == shares
  assert run.written(0, tmp_path / "w") >= {"helpsteer_2d.jsonl", "build_2d.json"}
  assert run.written(1, tmp_path / "w") == set()


def _build_2d_model(inputs, workdir) -> tuple[str, ...]:
  return ("--config=configs/build_2d.py", *MESH, *_scorer(inputs),
          "--config.data.demo_rows=12", f"--workdir={workdir}")


def test_build_2d_attribute_model_splits_by_the_mesh(inputs, tmp_path):
  proc = _single(*_build_2d_model(inputs, tmp_path / "single"))
  texts = _split(proc.stderr, "build_2d: texts scored")[0]
  run, results = _run_two(tmp_path, *_build_2d_model(inputs, tmp_path / "w"))
  _assert_same_build_2d(tmp_path / "single", tmp_path / "w")
  _assert_split(_split(results[0].stderr, "build_2d: texts scored"), texts)
  assert run.written(1, tmp_path / "w") == set()


# ------------------------------------------------------- 2D-DPO reference pass


def _dpo2d(inputs, workdir) -> tuple[str, ...]:
  return ("--config=configs/dpo2d.py", *MODEL, *MESH, "--config.model.attention_block_size=64",
          f"--config.tokenizer={inputs['tokenizer']}",
          f"--config.data.demo_train_pairs={REFERENCE_PAIRS}",
          "--config.data.demo_validation_pairs=0", "--config.data.max_segments=8",
          "--config.reference.batch=8", "--config.train.num_steps=1",
          "--config.train.global_batch=8", "--config.train.micro_batch=8",
          "--config.train.seq_len=128", "--config.train.export_hf=False",
          "--config.train.save_every=100", "--config.optimizer.warmup_steps=0",
          "--config.optimizer.schedule=constant", f"--workdir={workdir}")


def _parts(workdir: pathlib.Path) -> list[pathlib.Path]:
  return sorted((workdir / "reference" / "train").glob("part_????????.npy"))


@pytest.fixture(scope="module")
def reference_single(inputs, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("dpo2d_single")
  proc = _single(*_dpo2d(inputs, workdir))
  assert _split(proc.stderr, "reference pass train: pairs computed") == [REFERENCE_PAIRS]
  return workdir / "reference" / "train"


def _assert_same_cache(single: pathlib.Path, workdir: pathlib.Path) -> None:
  cache = workdir / "reference" / "train"
  names = sorted(p.name for p in single.iterdir())
  assert sorted(p.name for p in cache.iterdir()) == names
  assert len(names) == REFERENCE_PAIRS // 8 + 1  # the parts and the manifest
  _assert_same(single, cache, *names)


def test_reference_pass_two_processes_write_the_one_process_cache(
    inputs, reference_single, tmp_path):
  run, results = _run_two(tmp_path, *_dpo2d(inputs, tmp_path / "w"))
  _assert_same_cache(reference_single, tmp_path / "w")
  _assert_split(_split(results[0].stderr, "reference pass train: pairs computed"),
                REFERENCE_PAIRS)
  assert run.written(1, tmp_path / "w" / "reference") == set()


def test_reference_pass_resumes_after_process_0_is_killed(inputs, reference_single, tmp_path):
  stopped, hung, kept, results = _killed_and_rerun(
      tmp_path, _dpo2d(inputs, tmp_path / "w"), 0, lambda: len(_parts(tmp_path / "w")), 3,
      tmp_path / "w" / "reference")
  batches = REFERENCE_PAIRS // 8
  assert 3 <= kept < batches
  assert f"reference pass: {batches - kept} of {batches} batches" in results[0].stderr
  _assert_same_cache(reference_single, tmp_path / "w")
  _assert_split(_split(results[0].stderr, "reference pass train: pairs computed"),
                REFERENCE_PAIRS - 8 * kept)
  _assert_survivor_stopped(stopped, 0, hung)


# ------------------------------------------------------------------ rl


def _rl(inputs, workdir) -> tuple[str, ...]:
  """GRPO with a host-side scorer (split over the processes) and two updates per
  iteration."""
  return ("--config=configs/rl.py", *MODEL, *MESH, "--config.init.checkpoint=",
          f"--config.tokenizer={inputs['tokenizer']}",
          "--config.scorer.source=fake_scorer:make_brevity",
          "--config.prompts.demo_train_prompts=16", "--config.prompts.eval_limit=4",
          "--config.rollout.prompts_per_iteration=4", "--config.rollout.samples_per_prompt=4",
          "--config.rollout.max_new_tokens=12", "--config.train.num_steps=2",
          "--config.train.global_batch=8", "--config.train.micro_batch=8",
          "--config.train.seq_len=128", "--config.train.loss_chunk_size=64",
          "--config.train.export_hf=false", "--config.optimizer.lr=1e-2", f"--workdir={workdir}")


RL_EXACT = ("step", "reward", "reward_normalized", "reward_std", "score", "response_length",
            "truncated", "learning_rate")
RL_TIMINGS = ("time", "rollout_tokens_per_s", "update_tokens_per_s", "rollout_s", "score_s",
              "update_s", "iteration_s")


def test_rl_two_processes_train_as_one(inputs, tmp_path):
  """Rollouts, rewards, advantages and updates with two processes equal one process's:
  the same samples and rewards (the eval samples byte for byte), and losses and weights
  equal up to the order of the gradient all-reduce across processes (as the SFT loop's,
  tests/test_multihost.py)."""
  _single(*_rl(inputs, tmp_path / "single"))
  run, _ = _run_two(tmp_path, *_rl(inputs, tmp_path / "w"))
  _assert_same(tmp_path / "single", tmp_path / "w", "samples/iteration_000000.jsonl",
               "samples/iteration_000002.jsonl")

  def metrics(workdir):
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in RL_TIMINGS} for r in rows]

  one, two = metrics(tmp_path / "single"), metrics(tmp_path / "w")
  assert [sorted(r) for r in one] == [sorted(r) for r in two] and len(one) == 4
  for a, b in zip(one, two):
    for key in a:
      if key in RL_EXACT or key.startswith("eval_"):
        assert a[key] == b[key], (a["step"], key)
      else:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=key)
  from helpsteer_jax import saved_params
  shapes, _ = saved_params.param_shapes(tmp_path / "single")
  import jax
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = {}
  for path, shape in shapes.items():
    node = target
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = jax.ShapeDtypeStruct(shape, np.float32, sharding=device)
  a, _ = saved_params.restore_params(tmp_path / "single", target)
  b, _ = saved_params.restore_params(tmp_path / "w", target)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    # Adam turns a rounding-level gradient difference into up to a fraction of lr.
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-5, atol=1e-4)
  assert {p.split(os.sep)[0] for p in run.written(1, tmp_path / "w")} <= {"checkpoints"}


# ------------------------------------------------------------------ iterated tasks


def _iterated(task: str, inputs, workdir, *extra: str) -> tuple[str, ...]:
  """One round of `task` from a random policy with a host-side scorer (split over the
  processes)."""
  return (f"--config=configs/{task}.py", *MODEL, *MESH, "--config.init.checkpoint=",
          f"--config.tokenizer={inputs['tokenizer']}", "--config.iterations=1",
          "--config.sampling.responses=3", "--config.sampling.max_new_tokens=12",
          "--config.sampling.batch_prompts=4", "--config.train.num_steps=2",
          "--config.train.global_batch=8", "--config.train.micro_batch=8",
          "--config.train.seq_len=160", "--config.train.loss_chunk_size=32",
          "--config.train.export_hf=false", "--config.optimizer.lr=1e-2",
          f"--workdir={workdir}", *extra)


def test_steerlm2_two_processes_write_the_one_process_files(inputs, tmp_path):
  """The groups file (samples, attribute log-probs, both models' log-probs) of two
  processes is the one process's byte for byte; process 1 writes none of it."""
  args = ("--config.scorer.source=fake_scorer:make", "--config.prompts.demo_rows=8",
          "--config.unconditional.with_label=false", "--config.eval.requests=8",
          "--config.prompts.per_iteration=8", "--config.eval.prompts=2",
          "--config.eval.scores=1,3", "--config.eval.max_new_tokens=8")
  _single(*_iterated("steerlm2", inputs, tmp_path / "single", *args))
  run, _ = _run_two(tmp_path, *_iterated("steerlm2", inputs, tmp_path / "w", *args))
  _assert_same(tmp_path / "single", tmp_path / "w", "iteration_1/samples.jsonl",
               "iteration_0/sweep_generations.jsonl", "iteration_1/sweep_generations.jsonl")
  assert {p.split(os.sep)[1] for p in run.written(1, tmp_path / "w")} <= {"checkpoints"}


def test_iterative_dpo_two_processes_write_the_one_process_files(inputs, tmp_path):
  args = ("--config.scorer.source=fake_scorer:make_brevity", "--config.prompts.eval_limit=4",
          "--config.prompts.demo_train_prompts=8", "--config.prompts.per_iteration=8",
          "--config.reference.batch=8", "--config.optimizer.warmup_steps=0")
  _single(*_iterated("iterative_dpo", inputs, tmp_path / "single", *args))
  run, _ = _run_two(tmp_path, *_iterated("iterative_dpo", inputs, tmp_path / "w", *args))
  _assert_same(tmp_path / "single", tmp_path / "w", "iteration_1/samples.jsonl",
               "iteration_1/pairs.jsonl", "iteration_0/eval.json")
  assert {p.split(os.sep)[1] for p in run.written(1, tmp_path / "w")} <= {
      "checkpoints", "reference"}
