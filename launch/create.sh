#!/usr/bin/env bash
# Creates a TPU VM (one host or a pod slice). Step 1 of launch/README.md.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ACCELERATOR="${ACCELERATOR:-v4-8}"
VERSION="${VERSION:-}"
SPOT="${SPOT:-0}"

usage() {
  cat <<EOF
usage: launch/create.sh --name NAME [--zone Z] [--accelerator TYPE] [--version V] [--spot] [--dry_run]

Runs: gcloud compute tpus tpu-vm create NAME --zone=Z --accelerator-type=TYPE --version=V

  --accelerator TYPE  ACCELERATOR  v4-8 (default), v4-32, v5litepod-8, v5p-8, v6e-8, ...
  --version V         VERSION      runtime image; default picked from the accelerator:
                                   v5litepod-* v2-alpha-tpuv5-lite, v5p-* v2-alpha-tpuv5,
                                   v6e-* v2-alpha-tpuv6e, otherwise tpu-ubuntu2204-base
  --spot              SPOT=1       a spot (preemptible) VM: cheaper, and runs resume anyway
${COMMON_USAGE}

example: DRY_RUN=1 TPU_NAME=mtrl-v4 launch/create.sh --accelerator v4-32
EOF
}

parse_common_flags "$@"
set -- "${REST[@]+"${REST[@]}"}"
while (($#)); do
  case "$1" in
    --accelerator) ACCELERATOR="${2:?}"; shift 2 ;;
    --accelerator=*) ACCELERATOR="${1#*=}"; shift ;;
    --version) VERSION="${2:?}"; shift 2 ;;
    --version=*) VERSION="${1#*=}"; shift ;;
    --spot) SPOT=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
no_passthru
require_name

if [[ -z "${VERSION}" ]]; then
  case "${ACCELERATOR}" in
    v5litepod-*|v5e-*) VERSION=v2-alpha-tpuv5-lite ;;
    v5p-*) VERSION=v2-alpha-tpuv5 ;;
    v6e-*) VERSION=v2-alpha-tpuv6e ;;
    *) VERSION=tpu-ubuntu2204-base ;;
  esac
fi

gcloud_where
extra=()
[[ "${SPOT}" != "1" ]] || extra+=(--spot)
run gcloud compute tpus tpu-vm create "${TPU_NAME}" "${GCLOUD_WHERE[@]}" \
  --accelerator-type="${ACCELERATOR}" --version="${VERSION}" "${extra[@]+"${extra[@]}"}"
echo "next: TPU_NAME=${TPU_NAME} ZONE=${ZONE} launch/setup.sh --all" >&2
