"""The memory-plan script's rendering of recorded compiles."""

import importlib.util
import sys

from helpsteer_jax import aot

from conftest import REPO_ROOT


def _plan_module():
  spec = importlib.util.spec_from_file_location(
      "memory_plan", REPO_ROOT / "benchmarks" / "memory_plan.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules["memory_plan"] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def _report(total_gib, hbm_gib=95, chips=32):
  gib = 2**30
  mem = dict(arguments=10 * gib, outputs=10 * gib, aliased=10 * gib,
             temporaries=int((total_gib - 10) * gib), generated_code=0)
  mem.update(total=int(total_gib * gib), hbm=hbm_gib * gib, fits=total_gib <= hbm_gib)
  return {"memory": mem, "chips": chips, "remat_policy": "full",
          "mesh": {"data": 1, "fsdp": chips, "tensor": 1}}


def test_render_reads_batches_remat_and_smallest_slice():
  mp = _plan_module()
  recipe = mp.RECIPES[1]  # llama2_70b AC-SFT: 128 rows per step
  cells = {
      mp._key(recipe, "v5p-64", 1, "full", 0): _report(67.7),
      mp._key(recipe, "v5p-64", 2, "full", 0): _report(80.5),
      mp._key(recipe, "v5p-64", 4, "full", 0): _report(101.0),
      mp._key(recipe, "v5p-64", 1, mp.LIGHT_REMAT, 0): _report(120.0),
      mp._key(recipe, "v5p-32", 1, "full", 0): _report(130.0),
      mp._key(recipe, "v5e-256", 1, "full", 0): _report(17.0, hbm_gib=16),
      # v5p-256: 128 chips hold the 128 rows of a step at one row each.
      mp._key(recipe, "v5p-256", 1, "full", 0): _report(22.2, chips=128),
      mp._key(recipe, "v5p-256", 1, mp.LIGHT_REMAT, 0): {
          "memory": aot.oom_report("RESOURCE_EXHAUSTED: the total memory required for HLO"
                                   " temporaries (103.27G) exceeds available HBM", 95 * 2**30),
          "chips": 128, "remat_policy": mp.LIGHT_REMAT,
          "mesh": {"data": 1, "fsdp": 128, "tensor": 1}},
  }
  lines = mp.render({"cells": cells}).splitlines()

  def row(prefix):
    return next(line for line in lines if line.startswith(prefix))

  v5p = row(f"| {recipe.name} | v5p-64 |")
  assert "| 2 |" in v5p and "| 80.5 |" in v5p and "| fits |" in v5p
  assert "120.0 (does not fit)" in v5p
  assert "none (1 does not fit)" in row(f"| {recipe.name} | v5e-256 |")
  assert "not compiled yet" in row(f"| {recipe.name} | v5p-128 |")
  v5p_256 = row(f"| {recipe.name} | v5p-256 |")
  assert "| 1 (all rows of the step) | 22.2 |" in v5p_256
  assert "> 103.3 (XLA out-of-memory) (does not fit)" in v5p_256
  assert f"| {recipe.name} | v5p-64 | 67.7 |" in lines  # smallest slice: v5p-32 does not fit
