#!/usr/bin/env bash
# Copies the per-worker logs home, then deletes the TPU VM (billing stops at delete).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

FETCH_LOGS="${FETCH_LOGS:-1}"
LOCAL_LOGS="${LOCAL_LOGS:-${REPO_ROOT}/logs}"
YES="${YES:-0}"

usage() {
  cat <<EOF
usage: launch/teardown.sh --name NAME [--zone Z] [--no_logs] [--logs_only] [--yes] [--dry_run]

  1. gcloud compute tpus tpu-vm scp --worker=all NAME:REMOTE_DIR/logs/worker-*.log LOCAL_LOGS/NAME/
     (one file per worker, so the copies do not collide; skip with --no_logs / FETCH_LOGS=0)
  2. gcloud compute tpus tpu-vm delete NAME --zone=Z --quiet  (asks first on a terminal unless --yes)

  --logs_only        fetch the logs, keep the VM
  LOCAL_LOGS         default <repo>/logs
  Workdirs on the VM's disk go with it: copy what you need first, or write runs to a bucket.
${COMMON_USAGE}
EOF
}

DELETE=1
parse_common_flags "$@"
set -- "${REST[@]+"${REST[@]}"}"
while (($#)); do
  case "$1" in
    --no_logs) FETCH_LOGS=0; shift ;;
    --logs_only) DELETE=0; shift ;;
    --yes) YES=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
no_passthru
require_name
gcloud_where

if [[ "${FETCH_LOGS}" == "1" ]]; then
  dest="${LOCAL_LOGS}/${TPU_NAME}"
  run mkdir -p "${dest}"
  # A worker that never ran a job has no log; that is not a reason to keep the VM.
  run gcloud compute tpus tpu-vm scp "${TPU_NAME}:${REMOTE_DIR}/logs/worker-*.log" "${dest}/" \
    --worker=all "${GCLOUD_WHERE[@]}" || echo "warning: could not fetch all logs" >&2
fi

[[ "${DELETE}" == "1" ]] || exit 0
if [[ "${DRY_RUN}" != "1" && "${YES}" != "1" && -t 0 ]]; then
  read -r -p "delete TPU VM ${TPU_NAME} in ${ZONE}? [y/N] " answer
  [[ "${answer}" == [yY]* ]] || { echo "kept ${TPU_NAME}"; exit 0; }
fi
run gcloud compute tpus tpu-vm delete "${TPU_NAME}" "${GCLOUD_WHERE[@]}" --quiet
