"""Test setup: eight fake CPU devices, created before jax is imported."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests run tiny models: LLVM's optimisation passes cost more than they save.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    " --xla_backend_optimization_level=0"
).strip()
os.environ.setdefault("TPU_LOG_DIR", os.path.join(os.path.dirname(__file__), "..", ".tpu_logs"))
# One persistent XLA compilation cache per test run, shared by both pytest workers (they
# inherit the variable) and every process a test starts (the CLI, servers, process
# groups), which compile the same tiny models' programs again and again; removed at the
# end by the process that made it. HELPSTEER_TEST_XLA_CACHE=0 turns it off.
_MADE_XLA_CACHE = ""
if os.environ.get("HELPSTEER_TEST_XLA_CACHE", "1") != "0":
  if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile
    _MADE_XLA_CACHE = tempfile.mkdtemp(prefix="helpsteer-jax-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _MADE_XLA_CACHE
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pathlib  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED_HELPSTEER2 = REPO_ROOT.parent / "shared" / "data" / "helpsteer2" / "train_first100.jsonl"

# The files whose tests take longest, started first: `pytest -n 2 --dist loadfile` hands
# out whole files in collection order, so a long file collected last keeps one worker
# busy while the other has nothing left.
SLOW_FIRST = (
    "test_real_model.py", "test_lora_training.py", "test_acsft_cli.py", "test_train_loop.py",
    "test_model.py", "test_fault_tolerance.py", "test_engine.py", "test_determinism.py",
    "test_decode.py", "test_family_tasks.py", "test_rm_hf_tasks.py", "test_aot_tasks.py",
    "test_marker_tokens.py", "test_steerlm_pipeline.py", "test_lora_tasks.py",
    "test_dpo2d_task.py", "test_lora.py", "test_lora_dpo.py", "test_serve.py",
    "test_rl_task.py", "test_steerlm2_task.py", "test_iterative_dpo_task.py")


def _stack() -> str:
  return "3.12" if sys.version_info >= (3, 12) else "3.11"


def pytest_collection_modifyitems(config, items):
  """`one_stack(version, reason=...)` tests run on that CI stack only; slow files first.

  CI runs the suite twice: on Python 3.11 (the pinned jax, PyTorch oracles) and in
  a Python 3.12 venv (the newest jax, flax, orbax). A slow case whose subject is
  the project's own logic runs on one of them (CI time);
  HELPSTEER_ALL_STACKS=1 runs every test on any stack.
  """
  everywhere = os.environ.get("HELPSTEER_ALL_STACKS") == "1"
  for item in items:
    marker = item.get_closest_marker("one_stack")
    if marker and not everywhere and marker.args[0] != _stack():
      why = marker.kwargs.get("reason", "CI time")
      item.add_marker(pytest.mark.skip(reason=(
          f"runs once per CI, on the Python {marker.args[0]} stack ({why});"
          " HELPSTEER_ALL_STACKS=1 runs it here")))
  rank = {name: i for i, name in enumerate(SLOW_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file


@pytest.fixture(scope="session")
def helpsteer2_sample() -> pathlib.Path:
  """The first 100 real HelpSteer2 rows, when the shared data is present."""
  if not SHARED_HELPSTEER2.exists():
    pytest.skip(f"real HelpSteer2 sample not found at {SHARED_HELPSTEER2}")
  return SHARED_HELPSTEER2


@pytest.fixture(scope="session")
def sentencepiece_dir(tmp_path_factory) -> pathlib.Path:
  """A directory with mistral-common's Llama-2-style SentencePiece model (real tokenizer)."""
  import shutil
  mistral_common = pytest.importorskip("mistral_common")
  src = pathlib.Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
  out = tmp_path_factory.mktemp("sentencepiece") / "tokenizer"
  out.mkdir()
  shutil.copy(src, out / "tokenizer.model")
  return out


def pytest_unconfigure(config):
  if _MADE_XLA_CACHE:
    import shutil
    shutil.rmtree(_MADE_XLA_CACHE, ignore_errors=True)
