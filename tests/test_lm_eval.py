"""lm-evaluation-harness through the server equals its own transformers backend.

`benchmarks/lm_eval_vs_hf.py` end to end on the serve tests' tiny fp32 model:
a multiple-choice task (loglikelihood requests: echo + logprobs) and a greedy
generate_until task through lm-eval's `local-completions` against the server,
next to `--model hf`. lm-eval runs from a virtual environment of its own
($HELPSTEER_LM_EVAL_VENV) or from this interpreter when it imports `lm_eval`;
otherwise the test skips.
"""

import importlib.util
import os
import pathlib
import sys

import pytest

from conftest import REPO_ROOT
from serve_utils import write_models

INSTALL = ("lm-eval is not installed: python3.11 -m venv /tmp/lmeval-venv &&"
           " /tmp/lmeval-venv/bin/pip install torch==2.13.0 &&"
           " /tmp/lmeval-venv/bin/pip install 'lm-eval[hf,api]==0.4.13', then run with"
           " HELPSTEER_LM_EVAL_VENV=/tmp/lmeval-venv")


def _venv() -> str | None:
  """lm-eval's venv, or None for this interpreter's; skips when neither has it."""
  venv = os.environ.get("HELPSTEER_LM_EVAL_VENV")
  if venv and (pathlib.Path(venv) / "bin" / "lm_eval").exists():
    return venv
  if importlib.util.find_spec("lm_eval") is None:
    pytest.skip(INSTALL)
  return None


def _bench():
  sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
  spec = importlib.util.spec_from_file_location(
      "lm_eval_vs_hf", REPO_ROOT / "benchmarks" / "lm_eval_vs_hf.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_lm_eval_scores_through_the_server_equal_the_hf_backend(tmp_path):
  venv = _venv()
  write_models(tmp_path)
  result = _bench().compare(tmp_path / "policy", tmp_path, venv, limit=8)
  rows = {(r["task"], r["metric"]): r for r in result["rows"]}
  assert {"acc", "acc_norm", "exact_match"} <= {metric for _, metric in rows}, rows
  for r in rows.values():
    assert r["ours"] == pytest.approx(r["hf"]), r
    if r["max_loglikelihood_diff"] is not None:
      assert r["max_loglikelihood_diff"] < 1e-3, r
    if r["generations_differing"] is not None:
      assert r["generations_differing"] == 0, r
