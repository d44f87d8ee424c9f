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
