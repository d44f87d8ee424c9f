#!/usr/bin/env bash
# Run a helpsteer-jax task on a Cloud TPU VM slice (single- or multi-host).
#
#   launch/tpu_vm.sh --name NAME --zone ZONE --accelerator v5p-128 \
#       [--project P] [--version RUNTIME] [--queued [--spot]] \
#       [--workdir /mnt/shared/run1] [--max-requeues N] [--dry-run] \
#       -- --config=configs/acsft.py:llama2_70b --config.init.source=/mnt/models/Llama-2-70b-hf
#
# 1. reuses the TPU VM NAME if it is READY, else creates it (directly, or as a
#    queued resource with --queued, waiting until it is ACTIVE); a preempted one
#    (VM PREEMPTED or TERMINATED, queued resource SUSPENDED or FAILED) is deleted
#    and created again;
# 2. copies this source tree to every worker and installs it with the tpu extra;
# 3. runs `python -m helpsteer_jax.main ARGS` on all workers at once. Each
#    worker is one JAX process; `jax.distributed` finds the others through the
#    TPU metadata (config.distributed.mode=auto).
# 4. requeues: when the run exits with the preemption status (3: stopped by a
#    SIGTERM, every process saved one checkpoint) or the TPU was preempted under it
#    (the last complete checkpoint is there), steps 1-3 run again and the run
#    resumes, at most --max-requeues times (default 10). Any other exit status is
#    the script's own.
# The workdir must be shared by all workers (a gcsfuse or Filestore mount):
# Orbax writes one checkpoint cooperatively and process 0 writes the logs.
# --dry-run prints the gcloud commands instead of running them.
set -euo pipefail

PREEMPTED_EXIT=3  # helpsteer_jax/runs/summary.py's PREEMPTED_EXIT
NAME="" ZONE="" ACCEL="" PROJECT="" VERSION="" QUEUED=0 SPOT=0 DRY=0 MAX_REQUEUES=10
WORKDIR='$HOME/helpsteer-workdir'  # expanded on the workers
REMOTE_DIR="helpsteer-jax"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --zone) ZONE="$2"; shift 2 ;;
    --accelerator) ACCEL="$2"; shift 2 ;;
    --project) PROJECT="$2"; shift 2 ;;
    --version) VERSION="$2"; shift 2 ;;
    --workdir) WORKDIR="$2"; shift 2 ;;
    --max-requeues) MAX_REQUEUES="$2"; shift 2 ;;
    --queued) QUEUED=1; shift ;;
    --spot) SPOT=1; shift ;;
    --dry-run) DRY=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z "$NAME" || -z "$ZONE" || -z "$ACCEL" || $# -eq 0 ]]; then
  echo "usage: $0 --name NAME --zone ZONE --accelerator TYPE [options] -- --config=... (see --help)" >&2
  exit 2
fi
if [[ ! "$MAX_REQUEUES" =~ ^[0-9]+$ ]]; then
  echo "--max-requeues takes a count (0 = never), got $MAX_REQUEUES" >&2
  exit 2
fi
if [[ -z "$VERSION" ]]; then  # the base runtime of each generation
  case "$ACCEL" in
    v4-*) VERSION="tpu-ubuntu2204-base" ;;
    v5litepod-*|v5e-*) VERSION="v2-alpha-tpuv5-lite" ;;
    v5p-*) VERSION="v2-alpha-tpuv5" ;;
    v6e-*) VERSION="v2-alpha-tpuv6e" ;;
    *) VERSION="tpu-ubuntu2204-base" ;;
  esac
fi
# Cloud TPU calls v5e slices v5litepod-N.
ACCEL="${ACCEL/#v5e-/v5litepod-}"

GCLOUD=(gcloud compute tpus)
COMMON=(--zone="$ZONE")
[[ -n "$PROJECT" ]] && COMMON+=(--project="$PROJECT")
EXTRA=(); [[ $SPOT -eq 1 ]] && EXTRA+=(--spot)

run() {
  if [[ $DRY -eq 1 ]]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

vm_state() {  # READY, PREEMPTED, ...; empty when there is no such VM
  "${GCLOUD[@]}" tpu-vm describe "$NAME" "${COMMON[@]}" --format='value(state)' 2>/dev/null || true
}

queued_state() {  # ACTIVE, SUSPENDED, ...; empty when there is no such request
  "${GCLOUD[@]}" queued-resources describe "$NAME" "${COMMON[@]}" \
      --format='value(state.state)' 2>/dev/null || true
}

wait_until_ready() {
  until [[ "$(vm_state)" == READY ]]; do
    echo "waiting for TPU VM $NAME (queued resource: $(queued_state)) ..."; sleep 60
  done
}

create() {
  if [[ $QUEUED -eq 1 ]]; then
    run "${GCLOUD[@]}" queued-resources create "$NAME" --node-id="$NAME" \
        --accelerator-type="$ACCEL" --runtime-version="$VERSION" "${COMMON[@]}" "${EXTRA[@]}"
    if [[ $DRY -eq 1 ]]; then
      run "${GCLOUD[@]}" queued-resources describe "$NAME" "${COMMON[@]}" --format='value(state.state)'
    else
      wait_until_ready
    fi
  else
    run "${GCLOUD[@]}" tpu-vm create "$NAME" --accelerator-type="$ACCEL" \
        --version="$VERSION" "${COMMON[@]}" "${EXTRA[@]}"
  fi
}

# 1. The TPU VM: reused when READY, created again when preempted.
provision() {
  if [[ $DRY -eq 1 ]]; then
    echo "# (dry run: creating $NAME unless \`${GCLOUD[*]} tpu-vm describe $NAME\` finds it READY)"
    create
    return
  fi
  local vm queued
  vm="$(vm_state)"
  if [[ "$vm" == READY ]]; then
    echo "reusing TPU VM $NAME"
    return
  fi
  if [[ $QUEUED -eq 1 ]]; then
    queued="$(queued_state)"
    case "$queued" in
      "") ;;
      SUSPENDED|FAILED)  # preempted, or never granted: no longer eligible, so anew
        run "${GCLOUD[@]}" queued-resources delete "$NAME" "${COMMON[@]}" --force --quiet ;;
      *) wait_until_ready; return ;;  # still waiting, provisioning or starting
    esac
  else
    case "$vm" in
      "") ;;
      PREEMPTED|TERMINATED) run "${GCLOUD[@]}" tpu-vm delete "$NAME" "${COMMON[@]}" --quiet ;;
      *) wait_until_ready; return ;;
    esac
  fi
  create
}

# 2. The code, on every worker.
SRC="$(cd "$(dirname "$0")/.." && pwd)"
ARCHIVE="${TMPDIR:-/tmp}/helpsteer-jax-src.tar.gz"
install_code() {
  run tar -czf "$ARCHIVE" -C "$SRC" --exclude=.git --exclude=workdir --exclude='*.pyc' .
  run "${GCLOUD[@]}" tpu-vm scp "$ARCHIVE" "$NAME:~/helpsteer-jax-src.tar.gz" --worker=all "${COMMON[@]}"
  local setup="mkdir -p ~/$REMOTE_DIR && tar -xzf ~/helpsteer-jax-src.tar.gz -C ~/$REMOTE_DIR"
  setup+=" && cd ~/$REMOTE_DIR && python3 -m pip install -q -e '.[tpu]'"
  run "${GCLOUD[@]}" tpu-vm ssh "$NAME" --worker=all "${COMMON[@]}" --command="$setup"
}

# 3. The task, on all workers at once (one JAX process per worker). gcloud exits with
# the first worker's non-zero status; every process exits with the same one.
ARGS=""
for a in "$@"; do ARGS+=" $(printf '%q' "$a")"; done
TASK="cd ~/$REMOTE_DIR && python3 -m helpsteer_jax.main$ARGS --workdir=$WORKDIR"

# 4. Requeue a preempted run.
requeues=0
while true; do
  provision
  install_code
  status=0
  run "${GCLOUD[@]}" tpu-vm ssh "$NAME" --worker=all "${COMMON[@]}" --command="$TASK" || status=$?
  if [[ $DRY -eq 1 || $status -eq 0 ]]; then
    exit "$status"
  fi
  if [[ $status -eq $PREEMPTED_EXIT ]]; then
    why="the run was preempted and saved a checkpoint (exit status $status)"
  elif vm="$(vm_state)" && [[ "$vm" != READY ]]; then
    why="TPU VM $NAME was preempted (${vm:-deleted}; exit status $status)"
  else
    exit "$status"
  fi
  if (( requeues >= MAX_REQUEUES )); then
    echo "$why; $MAX_REQUEUES requeues done (--max-requeues): rerun this command to resume" >&2
    exit "$status"
  fi
  requeues=$((requeues + 1))
  echo "$why: requeue $requeues of at most $MAX_REQUEUES, resuming from its checkpoint"
done
