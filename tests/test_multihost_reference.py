"""The 2D-DPO reference pass with two processes writes the cache of one process, and a
two-process pass that loses process 0 resumes to it.

The harness and what every two-process test checks: tests/task_groups.py.
"""

import pathlib

import pytest

import task_groups as tg

pytestmark = pytest.mark.multihost

REFERENCE_PAIRS = 128  # 16 batches of 8: time to kill a process between parts


def _dpo2d(task_inputs, workdir) -> tuple[str, ...]:
  return ("--config=configs/dpo2d.py", *tg.MODEL, *tg.MESH,
          "--config.model.attention_block_size=64",
          f"--config.tokenizer={task_inputs['tokenizer']}",
          f"--config.data.demo_train_pairs={REFERENCE_PAIRS}",
          "--config.data.demo_validation_pairs=0", "--config.data.max_segments=8",
          "--config.reference.batch=8", "--config.train.num_steps=1",
          "--config.train.global_batch=8", "--config.train.micro_batch=8",
          "--config.train.seq_len=128", "--config.train.export_hf=False",
          "--config.train.save_every=100", "--config.optimizer.warmup_steps=0",
          "--config.optimizer.schedule=constant", f"--workdir={workdir}")


def _parts(workdir: pathlib.Path) -> list[pathlib.Path]:
  return sorted((workdir / "reference" / "train").glob("part_????????.npy"))


def _assert_same_cache(single: pathlib.Path, workdir: pathlib.Path) -> None:
  cache = workdir / "reference" / "train"
  names = sorted(p.name for p in single.iterdir())
  assert sorted(p.name for p in cache.iterdir()) == names
  assert len(names) == REFERENCE_PAIRS // 8 + 1  # the parts and the manifest
  tg.assert_same(single, cache, *names)


def test_reference_pass_two_processes_killed_and_rerun_write_the_one_process_cache(
    task_inputs, tmp_path):
  """Process 0 killed between parts, then both rerun: the one-process cache, part for
  part; the rerun computes the remaining pairs split over the processes, and process 1
  writes nothing under reference/ in either run."""
  proc = tg.single(*_dpo2d(task_inputs, tmp_path / "single"))
  assert tg.split(proc.stderr, "reference pass train: pairs computed") == [REFERENCE_PAIRS]
  stopped, hung, kept, _, results = tg.killed_and_rerun(
      tmp_path, _dpo2d(task_inputs, tmp_path / "w"), 0, lambda: len(_parts(tmp_path / "w")), 3,
      tmp_path / "w" / "reference")
  batches = REFERENCE_PAIRS // 8
  assert 3 <= kept < batches
  assert f"reference pass: {batches - kept} of {batches} batches" in results[0].stderr
  _assert_same_cache(tmp_path / "single" / "reference" / "train", tmp_path / "w")
  tg.assert_split(tg.split(results[0].stderr, "reference pass train: pairs computed"),
                  REFERENCE_PAIRS - 8 * kept)
  tg.assert_survivor_stopped(stopped, 0, hung)
