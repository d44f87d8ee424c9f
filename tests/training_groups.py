"""Two processes of four CPU devices each training AC-SFT together, for the pod-fault tests
(tests/test_multihost_preemption.py, tests/test_multihost_lost_process.py) and the
one-process comparison (tests/test_multihost.py).

They train on a (data=2, fsdp=2, tensor=2) mesh spanning both, evaluating at the end. The
reference for every resumed run is the uninterrupted two-process run of the same config:
losses after a resume must be bitwise equal to it (same processes, same program); a
resume on one process of eight devices must reproduce it to float32 rounding (its
collectives sum in another order).
"""

import json
import pathlib
import time

from helpsteer_jax.data.demo import rows as demo
from helpsteer_jax.data.demo import tokenizer as demo_tokenizer

from multiprocess import Group, run_group

STEPS = 16
RUN = ("--config=configs/acsft.py", "--config.model.hidden_size=64",
       "--config.model.intermediate_size=128", "--config.model.num_layers=2",
       "--config.train.seq_len=128", "--config.train.global_batch=8",
       "--config.train.micro_batch=4", "--config.train.loss_chunk_size=64",
       f"--config.train.num_steps={STEPS}", "--config.train.log_every=1",
       "--config.train.eval_every=0", "--config.train.eval_batches=2",
       "--config.train.save_every=1000", "--config.train.export_hf=False",
       "--config.optimizer.warmup_steps=1", "--config.mesh.data=2",
       "--config.mesh.fsdp=2", "--config.mesh.tensor=2")


def write_inputs(root: pathlib.Path) -> None:
  """Demo rows (train and validation splits) and the demo tokenizer, in `root`."""
  data = root / "data"
  data.mkdir()
  for split, n, seed in (("train", 48, 5), ("validation", 16, 6)):
    (data / f"{split}.jsonl").write_text(
        "\n".join(json.dumps(r) for r in demo.demo_rows(n, seed=seed)) + "\n")
  demo_tokenizer.build_demo_tokenizer(root / "tokenizer")


def input_flags(root: pathlib.Path) -> tuple[str, ...]:
  """The command-line flags that read `write_inputs`' files."""
  return (f"--config.data.train_path={root / 'data'}",
          f"--config.data.validation_path={root / 'data'}",
          f"--config.tokenizer={root / 'tokenizer'}")


def losses(workdir: pathlib.Path) -> dict[int, float]:
  """Loss per step; a resumed run's rows come after the first run's."""
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


def train_uninterrupted(inputs: tuple[str, ...], workdir: pathlib.Path) -> None:
  """The reference: all STEPS steps with two processes, each one's output kept (`output`)."""
  for i, result in enumerate(run_group(*RUN, *inputs, f"--workdir={workdir}")):
    (workdir / f"process_{i}.stdout").write_text(result.stdout)
    (workdir / f"process_{i}.stderr").write_text(result.stderr)
  assert sorted(losses(workdir)) == list(range(1, STEPS + 1))


def output(workdir: pathlib.Path, i: int) -> tuple[str, str]:
  """Process i's (stdout, stderr) in `train_uninterrupted`'s run."""
  return ((workdir / f"process_{i}.stdout").read_text(),
          (workdir / f"process_{i}.stderr").read_text())


def wait_for_steps(group: Group, workdir: pathlib.Path, steps: int,
                   timeout: float = 300) -> None:
  deadline = time.monotonic() + timeout
  metrics = workdir / "metrics.jsonl"
  while time.monotonic() < deadline:
    if metrics.exists() and len(losses(workdir)) >= steps:
      return
    if any(p.poll() is not None for p in group.procs):
      group.kill()
      raise AssertionError(f"a process ended before step {steps}:\n{group.stderr(0)[-3000:]}"
                           f"\n{group.stderr(1)[-3000:]}")
    time.sleep(0.05)
  group.kill()
  raise AssertionError(f"step {steps} not reached within {timeout} s")


def checkpoints(workdir: pathlib.Path) -> list[int]:
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
