"""The HelpSteer-2D demo files the pair tasks (dpo2d, build_2d) read when none is configured."""

from __future__ import annotations

import pathlib

from helpsteer_jax import runtime
from helpsteer_jax.data.demo import pairs_2d as demo_pairs_2d


def demo_2d_files(workdir: pathlib.Path, num_train: int, num_validation: int) -> tuple[str, str]:
  """(train, validation) HelpSteer-2D demo files, written once."""
  demo_dir = runtime.write_once(workdir / "demo_2d", "validation.jsonl", lambda d: (
      demo_pairs_2d.write_demo_2d(d, num_train, num_validation)))
  return str(demo_dir / "train.jsonl"), str(demo_dir / "validation.jsonl")
