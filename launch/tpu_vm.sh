#!/usr/bin/env bash
# Run a helpsteer-jax task on a Cloud TPU VM slice (single- or multi-host).
#
#   launch/tpu_vm.sh --name NAME --zone ZONE --accelerator v5p-128 \
#       [--project P] [--version RUNTIME] [--queued [--spot]] \
#       [--workdir /mnt/shared/run1] [--dry-run] \
#       -- --config=configs/acsft.py:llama2_70b --config.init.source=/mnt/models/Llama-2-70b-hf
#
# 1. reuses the TPU VM NAME if it exists, else creates it (directly, or as a
#    queued resource with --queued, waiting until it is ACTIVE);
# 2. copies this source tree to every worker and installs it with the tpu extra;
# 3. runs `python -m helpsteer_jax.main ARGS` on all workers at once. Each
#    worker is one JAX process; `jax.distributed` finds the others through the
#    TPU metadata (config.distributed.mode=auto).
# The workdir must be shared by all workers (a gcsfuse or Filestore mount):
# Orbax writes one checkpoint cooperatively and process 0 writes the logs.
# --dry-run prints the gcloud commands instead of running them.
set -euo pipefail

NAME="" ZONE="" ACCEL="" PROJECT="" VERSION="" QUEUED=0 SPOT=0 DRY=0
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
    --queued) QUEUED=1; shift ;;
    --spot) SPOT=1; shift ;;
    --dry-run) DRY=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z "$NAME" || -z "$ZONE" || -z "$ACCEL" || $# -eq 0 ]]; then
  echo "usage: $0 --name NAME --zone ZONE --accelerator TYPE [options] -- --config=... (see --help)" >&2
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

run() {
  if [[ $DRY -eq 1 ]]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

# 1. The TPU VM.
if [[ $DRY -eq 0 ]] && "${GCLOUD[@]}" tpu-vm describe "$NAME" "${COMMON[@]}" >/dev/null 2>&1; then
  echo "reusing TPU VM $NAME"
else
  [[ $DRY -eq 1 ]] && echo "# (dry run: creating $NAME unless \`${GCLOUD[*]} tpu-vm describe $NAME\` finds it)"
  if [[ $QUEUED -eq 1 ]]; then
    EXTRA=(); [[ $SPOT -eq 1 ]] && EXTRA+=(--spot)
    run "${GCLOUD[@]}" queued-resources create "$NAME" --node-id="$NAME" \
        --accelerator-type="$ACCEL" --runtime-version="$VERSION" "${COMMON[@]}" "${EXTRA[@]}"
    if [[ $DRY -eq 1 ]]; then
      run "${GCLOUD[@]}" queued-resources describe "$NAME" "${COMMON[@]}" --format='value(state.state)'
    else
      until [[ "$("${GCLOUD[@]}" queued-resources describe "$NAME" "${COMMON[@]}" \
                  --format='value(state.state)')" == ACTIVE ]]; do
        echo "waiting for queued resource $NAME ..."; sleep 60
      done
    fi
  else
    EXTRA=(); [[ $SPOT -eq 1 ]] && EXTRA+=(--spot)
    run "${GCLOUD[@]}" tpu-vm create "$NAME" --accelerator-type="$ACCEL" \
        --version="$VERSION" "${COMMON[@]}" "${EXTRA[@]}"
  fi
fi

# 2. The code, on every worker.
SRC="$(cd "$(dirname "$0")/.." && pwd)"
ARCHIVE="${TMPDIR:-/tmp}/helpsteer-jax-src.tar.gz"
run tar -czf "$ARCHIVE" -C "$SRC" --exclude=.git --exclude=workdir --exclude='*.pyc' .
run "${GCLOUD[@]}" tpu-vm scp "$ARCHIVE" "$NAME:~/helpsteer-jax-src.tar.gz" --worker=all "${COMMON[@]}"
SETUP="mkdir -p ~/$REMOTE_DIR && tar -xzf ~/helpsteer-jax-src.tar.gz -C ~/$REMOTE_DIR"
SETUP+=" && cd ~/$REMOTE_DIR && python3 -m pip install -q -e '.[tpu]'"
run "${GCLOUD[@]}" tpu-vm ssh "$NAME" --worker=all "${COMMON[@]}" --command="$SETUP"

# 3. The task, on all workers at once (one JAX process per worker).
ARGS=""
for a in "$@"; do ARGS+=" $(printf '%q' "$a")"; done
RUN="cd ~/$REMOTE_DIR && python3 -m helpsteer_jax.main$ARGS --workdir=$WORKDIR"
run "${GCLOUD[@]}" tpu-vm ssh "$NAME" --worker=all "${COMMON[@]}" --command="$RUN"
