"""The memory-plan script's depth extrapolation and its rendering."""

import importlib.util
import sys

from conftest import REPO_ROOT


def _plan_module():
  spec = importlib.util.spec_from_file_location(
      "memory_plan", REPO_ROOT / "benchmarks" / "memory_plan.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules["memory_plan"] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def _probe(layers, per_layer, fixed, hbm=95 * 2**30):
  mem = {part: fixed[part] + per_layer[part] * layers for part in per_layer}
  mem["total"] = (mem["arguments"] + mem["outputs"] - mem["aliased"] + mem["temporaries"]
                  + mem["generated_code"])
  mem.update(hbm=hbm, fits=mem["total"] <= hbm)
  return {"model_layers": layers, "memory": mem, "chips": 32, "remat_policy": "full",
          "mesh": {"data": 1, "fsdp": 32, "tensor": 1}}


def test_extrapolation_is_exact_for_memory_linear_in_depth():
  mp = _plan_module()
  gib = 2**30
  per_layer = dict(arguments=3 * gib // 10, outputs=3 * gib // 10, aliased=3 * gib // 10,
                   temporaries=gib // 2, generated_code=0)
  fixed = dict(arguments=gib, outputs=gib, aliased=gib, temporaries=4 * gib,
               generated_code=40 * 2**20)
  est = mp.extrapolate(_probe(4, per_layer, fixed), _probe(8, per_layer, fixed), 80)
  truth = _probe(80, per_layer, fixed)["memory"]
  for part in mp.MEMORY_PARTS + ("total",):
    assert abs(est[part] - truth[part]) <= 1, part
  assert est["fits"] == truth["fits"] and est["hbm"] == truth["hbm"]


def test_render_marks_fitting_and_missing_cells():
  mp = _plan_module()
  gib = 2**30
  recipe = mp.RECIPES[1]  # llama2_70b AC-SFT, 80 layers
  per_layer = dict(arguments=gib // 4, outputs=gib // 4, aliased=gib // 4,
                   temporaries=gib // 2, generated_code=0)
  fixed = dict(arguments=0, outputs=0, aliased=0, temporaries=2 * gib, generated_code=0)
  cells = {mp._key(recipe, "v5p-64", 1, "full", n): _probe(n, per_layer, fixed)
           for n in mp.PROBE_LAYERS}
  text = mp.render({"cells": cells})
  row = next(line for line in text.splitlines()
             if line.startswith(f"| {recipe.name} | v5p-64 |"))
  assert "| fits |" in row and "62.0" in row  # 2 + 80 * 0.75 GiB
  assert "not compiled yet" in next(line for line in text.splitlines()
                                    if line.startswith(f"| {recipe.name} | v5p-128 |"))
