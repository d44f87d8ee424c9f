"""The checks before a run: every given setting is read or refused (`config_reads`), a
setting without effect is named, and a rerun resumes only its own run
(`run_fingerprint`); default workdirs keep the guides' recipes apart.

The command-line tests run the rl task in a fresh directory, as a new user does from the
guide: DAPO, then GSPO in their default workdirs, then GSPO pointed at DAPO's.
"""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from helpsteer_jax import config_reads, run_fingerprint, task_configs, tasks
from helpsteer_jax.errors import ConfigError
from helpsteer_jax.rl import settings as rl_settings
from helpsteer_jax.rl.algorithms import REGISTRY

from conftest import REPO_ROOT, xla_flags
from train_utils import task_config

CONFIGS = REPO_ROOT / "helpsteer_jax" / "configs"


def _check(task: str, preset: str = "", overrides: dict | None = None) -> list[str]:
  """What main.py checks for `--config=task[:preset]` with `overrides` on the command line."""
  config = task_config(task, overrides, preset)
  given = task_configs.given_keys(str(CONFIGS / f"{task}.py"), preset, list(overrides or {}))
  module = tasks.get_task(task)
  return config_reads.check(config, given, tasks.config_reads(module))


# ------------------------------------------------------------- every setting read or refused

def test_an_algorithms_own_key_is_refused_under_another_naming_its_reader():
  with pytest.raises(ConfigError) as e:
    _check("rl", overrides={"loss.importance_level": "sequence_token"})
  assert ("loss.importance_level='sequence_token' (given by the command line) is read only"
          " when algorithm is gspo (this run: algorithm='grpo')") in str(e.value)
  assert "--config.allow_unread=loss.importance_level" in str(e.value)
  (warning,) = _check("rl", overrides={"algorithm": "gspo",
                                       "loss.importance_level": "sequence_token"})
  assert "clip range" in warning


def test_an_unread_value_is_validated_too_and_allow_unread_only_warns():
  with pytest.raises(ConfigError) as e:
    _check("rl", overrides={"loss.importance_level": "seq"})
  assert "choose one of sequence, sequence_token" in str(e.value)
  with pytest.raises(ConfigError, match="loss.gamma=2.0 and loss.lam=0.95 must be in"):
    _check("rl", overrides={"loss.gamma": 2.0, "allow_unread": "loss.gamma"})
  warnings = _check("rl", overrides={"loss.kl_coef": 0.1, "allow_unread": "loss.kl_coef"})
  assert any("loss.kl_coef=0.1" in w and "goes on without it" in w for w in warnings)
  with pytest.raises(ConfigError, match="allow_unread=loss.beta: no such key was given"):
    _check("rl", overrides={"allow_unread": "loss.beta"})


def test_keys_shared_by_every_algorithm_and_the_readers_of_each_loss_key():
  """Each `loss.*` key is an algorithm's own (a rule names its readers), a field every
  algorithm has, or one the shared settings read: none is left unaccounted."""
  shared_settings = {"eps_low", "eps_high", "aggregation", "truncation_penalty", "epochs",
                     "sampler_correction", "sampler_correction_cap", "track_kl",
                     "recompute_logprobs"}
  fields = {f.name for name in REGISTRY for f in dataclasses.fields(REGISTRY[name])}
  loss = task_config("rl").loss
  assert set(loss.keys()) <= fields | shared_settings, set(loss.keys()) - fields
  ruled = {k for r in rl_settings.config_reads() if isinstance(r, config_reads.Reads)
           for k in r.keys}
  assert "loss.kl_coef" in ruled and "loss.gamma" in ruled and "loss.epochs" not in ruled
  for key, value in (("loss.overlong_buffer", 4), ("loss.dynamic_sampling_rounds", 2),
                     ("loss.filter_truncated", True)):
    for algorithm in REGISTRY:
      _check("rl", overrides={"algorithm": algorithm, key: value})


def test_rollout_keys_are_read_under_their_settings_and_checked_anyway():
  with pytest.raises(ConfigError) as e:
    _check("rl", overrides={"rollout.multi_turn_reward": "last"})
  assert "rollout.multi_turn_reward='last': choose one of final, each" in str(e.value)
  assert "is read only when rollout.multi_turn is true" in str(e.value)
  _check("rl", overrides={"rollout.multi_turn": True, "rollout.multi_turn_reward": "each"})
  with pytest.raises(ConfigError, match="rollout.devices=4 .* read only when"
                                        " rollout.max_staleness is 1"):
    _check("rl", overrides={"rollout.devices": 4})
  with pytest.raises(ConfigError, match="reward.std=2.0 .* reward.normalize is fixed"):
    _check("rl", overrides={"reward.std": 2.0})
  with pytest.raises(ConfigError, match="teacher.source=.* algorithm is distill"):
    _check("rl", overrides={"teacher.source": "workdir/acsft"})


def test_a_preset_key_for_another_algorithm_is_refused_naming_the_preset():
  with pytest.raises(ConfigError) as e:
    _check("rl", "llama3_70b", {"algorithm": "grpo"})
  assert "loss.kl_coef=0.003 (given by preset llama3_70b) is read only when algorithm is" \
         " rloo or ppo" in str(e.value)
  assert "remove it" not in str(e.value)  # a preset's key cannot be removed
  assert _check("rl", "llama3_70b", {"algorithm": "ppo"}) == []


def test_a_preset_key_that_changes_no_result_is_dropped_with_a_warning():
  """A preset's scorer model (bf16 Llama 3 70B) means nothing for a served scorer, and a
  preset's reference-pass batch nothing without the cached pass: warnings, not errors."""
  warnings = _check("rl", "llama3_70b", {"scorer.source": "http://rm-host:8000/v1"})
  assert any(w.startswith("scorer.model.name='llama3_70b' (given by preset llama3_70b)")
             and w.endswith("the run goes on without it") for w in warnings), warnings
  (warning,) = _check("dpo2d", "llama3_8b", {"reference.mode": "on_the_fly"})
  assert "reference.batch" in warning
  with pytest.raises(ConfigError, match="reference.batch=4 .* remove it"):
    _check("dpo2d", "llama3_8b", {"reference.mode": "on_the_fly", "reference.batch": 4})


def test_every_preset_reads_every_key_it_sets():
  for path in sorted(CONFIGS.glob("*.py")):
    module = task_configs.load(path)
    if "get_config" not in module:
      continue
    task = module["get_config"]().task
    for preset in module.get("PRESETS", ()):
      _check(task, preset if preset != module["PRESETS"][0] else "")


def test_the_scorers_keys_by_kind():
  with pytest.raises(ConfigError, match=r"scorer.max_len=100 .* is read only when scorer"
                                        r".source is a path"):
    _check("rl", overrides={"scorer.max_len": 100})
  with pytest.raises(ConfigError, match="scorer.aggregation='win_count' .* read only when"
                                        " scorer.judge is genrm"):
    _check("evaluate_rm", overrides={"scorer.aggregation": "win_count"})
  with pytest.raises(ConfigError, match="scorer.penalty"):
    _check("rl", overrides={"scorer.penalty": -10.0})
  _check("rl", overrides={"scorer.source": "/models/am", "scorer.max_len": 100})
  _check("evaluate_rm", overrides={"scorer.judge": "genrm", "scorer.aggregation": "win_count",
                                   "scorer.source": "/models/genrm"})
  _check("rl", overrides={"scorer.source": "pkg.mod:factory", "scorer.penalty": -1.0})
  _check("evaluate_rm", overrides={"scorer.source": "demo_rules", "scorer.max_len": 64,
                                   "variants": "a=/models/am"})
  with pytest.raises(ConfigError, match="scorer.source=.* is read only when best_of_n.n is"):
    _check("generate", overrides={"scorer.source": "demo_rules"})
  _check("generate", overrides={"scorer.source": "demo_rules", "best_of_n.n": 2})


def test_a_pair_loss_option_is_read_by_its_loss_type_alone():
  with pytest.raises(ConfigError, match="loss.label_smoothing=0.1 .* read only when"
                                        " loss.loss_type is dpo"):
    _check("dpo2d", overrides={"loss.label_smoothing": 0.1})
  _check("dpo2d", overrides={"loss.loss_type": "dpo", "loss.label_smoothing": 0.1})
  with pytest.raises(ConfigError, match="reference.batch"):
    _check("dpo2d", overrides={"reference.mode": "on_the_fly", "reference.batch": 4})
  with pytest.raises(ConfigError, match="judge.model='gpt-4' .* judge.kind is openai"):
    _check("evaluate_generation", overrides={"judge.kind": "none", "judge.model": "gpt-4"})
  _check("evaluate_generation", overrides={"judge.kind": "openai", "judge.model": "gpt-4"})


def test_a_clip_range_without_effect_is_named():
  (warning,) = _check("rl", overrides={"algorithm": "gspo"})
  assert warning.startswith("loss.eps_low / loss.eps_high (gspo's clip range 0.0003 / 0.0004)"
                            " have no effect")
  assert len(_check("rl", overrides={"algorithm": "dapo"})) == 1
  assert len(_check("rl", overrides={"loss.eps_high": 0.3})) == 1
  assert _check("rl", overrides={"algorithm": "gspo", "loss.epochs": 2}) == []
  assert _check("rl", overrides={"algorithm": "dapo", "train.global_batch": 16}) == []
  assert _check("rl") == []
  (warning,) = _check("rl", overrides={"loss.track_kl": True})
  assert "loss.track_kl has no effect" in warning


# ------------------------------------------------------------------- default workdirs

def test_default_workdirs_keep_recipes_apart():
  path = str(CONFIGS / "rl.py")

  def workdir(preset="", **overrides):
    return task_configs.default_workdir(path, preset, task_config("rl", overrides, preset))
  assert workdir() == "workdir/rl"
  assert workdir(algorithm="dapo") == "workdir/rl_dapo"
  assert workdir(algorithm="gspo") == "workdir/rl_gspo"
  assert workdir("genrm") == "workdir/rl_genrm"
  assert workdir("genrm", algorithm="rloo") == "workdir/rl_genrm_rloo"
  assert workdir("llama3_70b") == "workdir/rl_llama3_70b"
  dpo = str(CONFIGS / "dpo2d.py")
  assert task_configs.default_workdir(
      dpo, "", task_config("dpo2d", {"loss.loss_type": "ipo"})) == "workdir/dpo2d_ipo"


# ------------------------------------------------------------------- run fingerprints

def _rl(**overrides):
  return task_config("rl", overrides)


def test_a_rerun_resumes_only_its_own_run(tmp_path):
  run_fingerprint.check_or_record(_rl(), tmp_path)
  record = json.loads((tmp_path / run_fingerprint.FILE).read_text())
  assert record["task"] == "rl" and record["settings"]["algorithm"] == "grpo"
  assert "train.num_steps" not in record["settings"] and "mesh.fsdp" not in record["settings"]
  (tmp_path / "checkpoints").mkdir()
  run_fingerprint.check_or_record(_rl(), tmp_path)  # the same run
  run_fingerprint.check_or_record(_rl(**{"train.num_steps": 80, "mesh.fsdp": 2}), tmp_path)
  with pytest.raises(ConfigError) as e:
    run_fingerprint.check_or_record(_rl(**{"optimizer.lr": 1e-4}), tmp_path)
  assert "optimizer.lr: 5e-05 then, 0.0001 now" in str(e.value)
  assert "Use another --workdir, or add --config.allow_changed=optimizer.lr" in str(e.value)
  run_fingerprint.check_or_record(_rl(**{"optimizer.lr": 1e-4,
                                         "allow_changed": "optimizer"}), tmp_path)
  record = json.loads((tmp_path / run_fingerprint.FILE).read_text())
  assert record["settings"]["optimizer.lr"] == 1e-4
  assert record["history"] == [{"changed": {"optimizer.lr": [5e-5, 1e-4]}}]
  run_fingerprint.check_or_record(_rl(**{"optimizer.lr": 1e-4}), tmp_path)


def test_the_guides_dapo_then_gspo_never_mix(tmp_path):
  run_fingerprint.check_or_record(_rl(algorithm="dapo"), tmp_path)
  (tmp_path / "metrics.jsonl").write_text("{}\n")
  with pytest.raises(ConfigError) as e:
    run_fingerprint.check_or_record(_rl(algorithm="gspo", **{"loss.epochs": 2}), tmp_path)
  assert "algorithm: 'dapo' then, 'gspo' now; loss.epochs: 1 then, 2 now" in str(e.value)
  other = task_config("acsft")
  with pytest.raises(ConfigError, match="task: 'rl' then, 'acsft' now"):
    run_fingerprint.check_or_record(other, tmp_path)


def test_a_workdir_without_work_takes_new_settings_and_a_broken_record_is_named(tmp_path):
  run_fingerprint.check_or_record(_rl(algorithm="dapo"), tmp_path)
  run_fingerprint.check_or_record(_rl(algorithm="gspo"), tmp_path)  # nothing written yet
  assert json.loads((tmp_path / run_fingerprint.FILE).read_text())["settings"][
      "algorithm"] == "gspo"
  (tmp_path / run_fingerprint.FILE).write_text("{not json")
  with pytest.raises(ConfigError, match="is not a run fingerprint"):
    run_fingerprint.check_or_record(_rl(), tmp_path)


def test_an_unwritable_workdir_is_named(tmp_path):
  (tmp_path / "a_file").write_text("")
  with pytest.raises(ConfigError, match="cannot write to the workdir"):
    run_fingerprint.check_or_record(_rl(), tmp_path / "a_file" / "run")


def test_a_run_that_stops_before_writing_anything_leaves_nothing(tmp_path):
  workdir = tmp_path / "run"
  run_fingerprint.check_or_record(_rl(), workdir).undo_unused()
  assert not workdir.exists()
  recorded = run_fingerprint.check_or_record(_rl(), workdir)
  (workdir / "checkpoints").mkdir()
  recorded.undo_unused()
  assert (workdir / run_fingerprint.FILE).is_file()


# ------------------------------------------------------------------- the command line

TINY_RL = ("--config.init.source=", "--config.model.hidden_size=32",
           "--config.model.intermediate_size=64", "--config.model.num_layers=1",
           "--config.model.num_heads=2", "--config.model.num_kv_heads=2",
           "--config.model.attention_block_size=32", "--config.rollout.prompts_per_iteration=2",
           "--config.rollout.samples_per_prompt=2", "--config.rollout.max_new_tokens=8",
           "--config.train.seq_len=64", "--config.train.global_batch=4",
           "--config.train.micro_batch=4", "--config.train.loss_chunk_size=32",
           "--config.train.eval_every=0", "--config.train.export_hf=false",
           "--config.prompts.demo_train_prompts=8", "--config.prompts.eval_limit=2",
           "--config.loss.dynamic_sampling_rounds=0")


def _cli(cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
  """The entry point run from `cwd`, as a user in a fresh directory."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(1),
             PYTHONPATH=str(REPO_ROOT))
  return subprocess.run([sys.executable, "-m", "helpsteer_jax.main", "--config=rl", *TINY_RL,
                         *args], cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=900)


def _finished(proc, iteration: int) -> None:
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"rl: finished at iteration {iteration}" in proc.stdout + proc.stderr


def test_the_guides_commands_in_their_default_workdirs(tmp_path):
  """DAPO, then GSPO: each in its own default workdir from its first iteration; GSPO
  pointed at DAPO's workdir is refused before anything loads, naming the keys; a key
  GRPO does not read is refused. (A run that resumes its own workdir with more
  iterations: test_a_rerun_resumes_only_its_own_run, tests/test_rl_resume.py.)"""
  _finished(_cli(tmp_path, "--config.algorithm=dapo", "--config.train.num_steps=1"), 1)
  _finished(_cli(tmp_path, "--config.algorithm=gspo", "--config.loss.epochs=2",
                 "--config.train.num_steps=1"), 1)
  dapo, gspo = tmp_path / "workdir" / "rl_dapo", tmp_path / "workdir" / "rl_gspo"
  for workdir, name in ((dapo, "dapo"), (gspo, "gspo")):
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward" in r] == [1], rows
    assert json.loads((workdir / "summary.json").read_text())["algorithm"] == name
  refused = _cli(tmp_path, "--config.algorithm=gspo", "--config.loss.epochs=2",
                 "--config.train.num_steps=2", f"--workdir={dapo}")
  assert refused.returncode == 2
  assert ("holds a run with other settings (algorithm: 'dapo' then, 'gspo' now;"
          " loss.epochs: 1 then, 2 now)") in refused.stderr
  assert len((dapo / "metrics.jsonl").read_text().splitlines()) == len(rows)
  unread = _cli(tmp_path, "--config.loss.importance_level=sequence_token")
  assert unread.returncode == 2 and "read only when algorithm is gspo" in unread.stderr
  assert not (tmp_path / "workdir" / "rl").exists()


@pytest.mark.multihost
def test_two_processes_refuse_another_run_alike(tmp_path):
  """Process 0 reads the workdir's fingerprint; both processes get its refusal and exit
  with the same error before anything loads, and the record stays as it was."""
  from multiprocess import run_group
  workdir = tmp_path / "rl_dapo"
  run_fingerprint.check_or_record(_rl(algorithm="dapo"), workdir)
  (workdir / "metrics.jsonl").write_text("{}\n")
  before = (workdir / run_fingerprint.FILE).read_text()
  results = run_group("--config=rl", *TINY_RL, "--config.algorithm=gspo",
                      f"--workdir={workdir}", devices=1, check=False, timeout=300)
  for r in results:
    assert r.returncode == 2, r.stderr[-3000:]
    assert "algorithm: 'dapo' then, 'gspo' now" in r.stderr
  assert (workdir / run_fingerprint.FILE).read_text() == before


def _guide_commands(text: str):
  """The `helpsteer-jax` commands of a guide's bash blocks, continuations joined."""
  for block in re.findall(r"```bash\n(.*?)```", text, re.S):
    for line in block.replace("\\\n", " ").splitlines():
      line = line.split(" #")[0].strip()
      if line.startswith("helpsteer-jax --config"):
        yield line


def test_the_guides_commands_never_share_a_workdir_with_other_settings():
  """Run in order from one directory, every guide's commands that resume a workdir each
  get their own run there: two commands with the same default (or given) workdir
  define the same run (a longer one at most). Commands with placeholders the config
  cannot take (`...`, `$VAR`) are left out."""
  sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
  import demo_runs
  from absl import flags
  shared, checked = [], 0
  for doc in sorted((REPO_ROOT / "docs").rglob("*.md")) + [REPO_ROOT / "README.md"]:
    runs = {}
    for command in _guide_commands(doc.read_text()):
      try:
        parsed = demo_runs.parse_cli(command, {})
      except (ConfigError, flags.Error, AttributeError, KeyError, ValueError, TypeError,
              OSError):
        continue
      if parsed is None or parsed.config.compile_only or not getattr(
          tasks.get_task(parsed.config.task), "RESUMES", False):
        continue
      checked += 1
      settings = run_fingerprint.fingerprint(parsed.config)
      first = runs.setdefault(parsed.workdir, (settings, command))
      if run_fingerprint.differences(first[0], settings):
        shared.append(f"{doc.name}: {parsed.workdir}: {first[1]!r} then {command!r}")
  assert not shared, "\n".join(shared)
  assert checked >= 40, checked  # the guides' commands parse: the check is not empty
