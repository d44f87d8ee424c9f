"""The launch scripts' dry runs print the commands they would run."""

import os
import shlex
import subprocess

from conftest import REPO_ROOT


def _dry(script, *args, env=None):
  proc = subprocess.run(["bash", str(REPO_ROOT / "launch" / script), *args], cwd=REPO_ROOT,
                        env={**os.environ, **(env or {})}, capture_output=True, text=True,
                        timeout=60)
  assert proc.returncode == 0, proc.stderr
  return ([shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")],
          proc.stdout)


def test_tpu_vm_dry_run_creates_copies_and_runs_on_all_workers():
  cmds, _ = _dry("tpu_vm.sh", "--name", "steer", "--zone", "us-east5-a", "--accelerator",
                 "v5e-256", "--queued", "--spot", "--workdir", "/mnt/runs/a", "--dry-run", "--",
                 "--config=configs/acsft.py:llama2_70b", "--config.init.source=/m/Llama 2")
  create = cmds[0]
  assert create[:5] == ["gcloud", "compute", "tpus", "queued-resources", "create"]
  assert "--accelerator-type=v5litepod-256" in create and "--spot" in create
  assert "--runtime-version=v2-alpha-tpuv5-lite" in create
  scp = next(c for c in cmds if "scp" in c)
  assert "--worker=all" in scp
  ssh = [c for c in cmds if "ssh" in c]
  assert all("--worker=all" in c for c in ssh) and len(ssh) == 2
  remote = shlex.split(next(a for a in ssh[-1] if a.startswith("--command=")).split("=", 1)[1])
  i = remote.index("helpsteer_jax.main")
  assert remote[i + 1:] == ["--config=configs/acsft.py:llama2_70b",
                            "--config.init.source=/m/Llama 2", "--workdir=/mnt/runs/a"]


def test_tpu_vm_requires_a_command():
  proc = subprocess.run(["bash", str(REPO_ROOT / "launch" / "tpu_vm.sh"), "--name", "x",
                         "--dry-run"], capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and "usage" in proc.stderr


def test_gpu_slurm_dry_run_one_process_per_gpu_with_slurm_coordinator():
  env = {"SLURM_JOB_NODELIST": "gpu-a,gpu-b,gpu-c", "SLURM_JOB_ID": "4242",
         "SLURM_NTASKS": "24", "SLURM_GPUS_PER_NODE": "h100:8"}
  cmds, out = _dry("gpu_slurm.sbatch", "--dry-run", "--workdir", "/shared/run", "--",
                   "--config=configs/acsft.py:llama3_70b", env=env)
  (srun,) = cmds
  assert srun[:4] == ["srun", "--nodes=3", "--ntasks=24", "--ntasks-per-node=8"]
  assert "--gpus-per-task=1" in srun
  task = shlex.split(srun[-1])
  assert task[:4] == ["exec", "python", "-m", "helpsteer_jax.main"]
  assert "--config=configs/acsft.py:llama3_70b" in task and "--workdir=/shared/run" in task
  assert "--config.distributed.coordinator_address=gpu-a:24242" in task
  assert "--config.distributed.num_processes=24" in task
  # Expanded by each task's own shell, so every process gets its rank and GPU.
  assert "--config.distributed.process_id=$SLURM_PROCID" in task
  assert "--config.distributed.local_device_ids=$SLURM_LOCALID" in task
  assert "coordinator gpu-a:24242, 24 processes on 3 nodes" in out


# The launchers run for real against fake gcloud / srun / scontrol / tar on PATH, each
# logging its arguments; a scenario file gives the task's exit statuses in turn.

FAKES = {
    # gcloud compute tpus <tpu-vm|queued-resources> <verb> NAME ...: states in files
    "gcloud": r"""#!/usr/bin/env bash
echo "gcloud $*" >> "$FAKE/log"
kind="$3" verb="$4"
case "$kind $verb" in
  "tpu-vm describe") [[ -f "$FAKE/vm" ]] && cat "$FAKE/vm" && exit 0; exit 1 ;;
  "queued-resources describe") [[ -f "$FAKE/qr" ]] && cat "$FAKE/qr" && exit 0; exit 1 ;;
  "tpu-vm create") echo READY > "$FAKE/vm" ;;
  "queued-resources create") echo ACTIVE > "$FAKE/qr"; echo READY > "$FAKE/vm" ;;
  "tpu-vm delete") rm -f "$FAKE/vm" ;;
  "queued-resources delete") rm -f "$FAKE/qr" "$FAKE/vm" ;;
  "tpu-vm ssh")
    [[ "$*" != *helpsteer_jax.main* ]] && exit 0
    next="$(head -n1 "$FAKE/exits")"; sed -i 1d "$FAKE/exits"
    if [[ "$next" == preempt-vm ]]; then  # the spot VM goes away under the run
      if [[ -f "$FAKE/qr" ]]; then echo SUSPENDED > "$FAKE/qr"; rm -f "$FAKE/vm"
      else echo PREEMPTED > "$FAKE/vm"; fi
      exit 255
    fi
    exit "$next" ;;
esac
""",
    "tar": "#!/usr/bin/env bash\necho \"tar $*\" >> \"$FAKE/log\"\n",
    # srun exits with the scenario's next status; `sigterm-job` first sends the batch
    # script (its parent) SIGTERM, as SLURM does to every process of a cancelled job
    "srun": r"""#!/usr/bin/env bash
echo "srun $*" >> "$FAKE/log"
next="$(head -n1 "$FAKE/exits")"
if [[ "$next" == sigterm-job ]]; then kill -TERM "$PPID"; sleep 1; next=3; fi
exit "$next"
""",
    "scontrol": r"""#!/usr/bin/env bash
echo "scontrol $*" >> "$FAKE/log"
[[ "$1 $2" == "show hostnames" ]] && tr ',' '\n' <<< "$3"
exit 0
""",
}


def _fakes(tmp_path, exits, vm=None, qr=None):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for name, text in FAKES.items():
    (bin_dir / name).write_text(text)
    (bin_dir / name).chmod(0o755)
  (tmp_path / "exits").write_text("".join(f"{e}\n" for e in exits))
  for name, state in (("vm", vm), ("qr", qr)):
    if state:
      (tmp_path / name).write_text(state + "\n")
  return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE": str(tmp_path),
          "TMPDIR": str(tmp_path)}


def _launch(tmp_path, script, *args, env):
  proc = subprocess.run(["bash", str(REPO_ROOT / "launch" / script), *args], cwd=REPO_ROOT,
                        env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
  log = (tmp_path / "log").read_text().splitlines() if (tmp_path / "log").exists() else []
  return proc, log


def _task_runs(log):
  return [line for line in log if "helpsteer_jax.main" in line]


def test_the_launchers_requeue_on_the_status_summary_py_defines():
  from helpsteer_jax.runs.summary import PREEMPTED_EXIT
  for script in ("tpu_vm.sh", "gpu_slurm.sbatch"):
    text = (REPO_ROOT / "launch" / script).read_text()
    assert f"\nPREEMPTED_EXIT={PREEMPTED_EXIT}  #" in text, script


TPU = ("--name", "steer", "--zone", "us-east5-a", "--accelerator", "v5p-8")


def test_tpu_vm_reruns_a_preempted_run_on_the_same_vm(tmp_path):
  proc, log = _launch(tmp_path, "tpu_vm.sh", *TPU, "--", "--config=configs/acsft.py",
                      env=_fakes(tmp_path, [3, 0], vm="READY"))
  assert proc.returncode == 0, proc.stderr
  assert len(_task_runs(log)) == 2
  assert not [line for line in log if line.startswith("gcloud")
              and line.split()[4] in ("create", "delete")]
  assert "preempted and saved a checkpoint (exit status 3): requeue 1 of at most 10" in proc.stdout


def test_tpu_vm_recreates_a_preempted_queued_resource_and_resumes(tmp_path):
  proc, log = _launch(tmp_path, "tpu_vm.sh", *TPU, "--queued", "--spot", "--",
                      "--config=configs/acsft.py", env=_fakes(tmp_path, ["preempt-vm", 0]))
  assert proc.returncode == 0, proc.stderr
  verbs = [" ".join(line.split()[3:5]) for line in log if line.startswith("gcloud")
           and (line.split()[4] in ("create", "delete") or "helpsteer_jax.main" in line)]
  assert verbs == ["queued-resources create", "tpu-vm ssh", "queued-resources delete",
                   "queued-resources create", "tpu-vm ssh"]
  assert "--force" in next(line for line in log if "queued-resources delete" in line)
  assert "TPU VM steer was preempted (deleted; exit status 255)" in proc.stdout


def test_tpu_vm_recreates_a_preempted_spot_vm(tmp_path):
  proc, log = _launch(tmp_path, "tpu_vm.sh", *TPU, "--spot", "--", "--config=configs/acsft.py",
                      env=_fakes(tmp_path, ["preempt-vm", 0], vm="READY"))
  assert proc.returncode == 0, proc.stderr
  assert [line.split()[3:5] for line in log if line.startswith("gcloud")
          and line.split()[4] in ("create", "delete")] == [["tpu-vm", "delete"],
                                                           ["tpu-vm", "create"]]
  assert len(_task_runs(log)) == 2


def test_tpu_vm_stops_on_other_failures_and_after_its_requeues(tmp_path):
  proc, log = _launch(tmp_path / "a", "tpu_vm.sh", *TPU, "--", "--config=configs/acsft.py",
                      env=_fakes(_mkdir(tmp_path / "a"), [1, 0], vm="READY"))
  assert proc.returncode == 1 and len(_task_runs(log)) == 1
  proc, log = _launch(tmp_path / "b", "tpu_vm.sh", *TPU, "--max-requeues", "1", "--",
                      "--config=configs/acsft.py",
                      env=_fakes(_mkdir(tmp_path / "b"), [3, 3, 0], vm="READY"))
  assert proc.returncode == 3 and len(_task_runs(log)) == 2
  assert "1 requeues done (--max-requeues): rerun this command to resume" in proc.stderr


def _mkdir(path):
  path.mkdir()
  return path


SLURM = {"SLURM_JOB_NODELIST": "gpu-a,gpu-b", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "16",
         "SLURM_GPUS_PER_NODE": "8"}


def test_gpu_slurm_requeues_a_run_stopped_before_the_time_limit(tmp_path):
  env = {**_fakes(tmp_path, [3]), **SLURM, "SLURM_RESTART_COUNT": "2"}
  proc, log = _launch(tmp_path, "gpu_slurm.sbatch", "--workdir", "/shared/run", "--",
                      "--config=configs/acsft.py", env=env)
  assert proc.returncode == 3, proc.stderr
  (srun,) = [shlex.split(line) for line in log if line.startswith("srun")]
  assert "--kill-on-bad-exit=0" in srun
  assert log[-1] == "scontrol requeue 4242"
  assert "requeueing job 4242 (requeue 3 of at most 20)" in proc.stdout


def test_gpu_slurm_leaves_finished_cancelled_and_exhausted_jobs_alone(tmp_path):
  for name, exits, extra, args in [("finished", [0], {}, ()),
                                   ("cancelled", ["sigterm-job"], {}, ()),
                                   ("exhausted", [3], {"SLURM_RESTART_COUNT": "2"},
                                    ("--max-requeues", "2"))]:
    work = _mkdir(tmp_path / name)
    proc, log = _launch(work, "gpu_slurm.sbatch", *args, "--", "--config=configs/acsft.py",
                        env={**_fakes(work, exits), **SLURM, **extra})
    assert proc.returncode == (0 if name == "finished" else 3), (name, proc.stderr)
    assert not [line for line in log if "requeue" in line], name
  assert "2 requeues done (--max-requeues); resubmit to resume" in proc.stderr
