#!/usr/bin/env bash
# Per-worker runner, on one TPU VM host: bootstrap, then the job, one log per worker.
#
#   bash launch/run_worker.sh --config=configs/grpo.py:estimator=rloo --workdir=/data/runs/rloo
#   ENTRY=sweep bash launch/run_worker.sh --config configs/grpo.py --grid 'seed=0,1' --root /data/sweep
#
# run_all.sh calls this on every worker; call it by hand on one worker to debug it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ENTRY="${ENTRY:-main}"                  # main: python -m mtrl_jax.main | sweep: python -m experiments.sweep
DIST="${DIST:-env}"                     # env | auto | none (see usage)
COORDINATOR_PORT="${COORDINATOR_PORT:-8476}"
LOG_DIR="${LOG_DIR:-${REPO_ROOT}/logs}"
VENV="${VENV:-${REPO_ROOT}/.venv}"
SKIP_SETUP="${SKIP_SETUP:-0}"
METADATA="${METADATA:-1}"               # 0: never ask the GCE metadata server

usage() {
  cat <<EOF
usage: launch/run_worker.sh [ARGS for mtrl_jax.main, or for python -m experiments.sweep with ENTRY=sweep]

env:
  ENTRY=main|sweep   what to run (default main)
  DIST=env           fill --config.distributed.{coordinator_address,num_processes,process_id}
                     from the TPU environment (TPU_WORKER_ID / TPU_WORKER_HOSTNAMES, else the
                     GCE metadata agent-worker-number / worker-network-endpoints); nothing on one host
  DIST=auto          pass --config.distributed.auto=true: jax.distributed finds the pod itself
  DIST=none          no distributed flags
  WORKER_ID          overrides the detected worker index (also names the log)
  COORDINATOR_PORT   default 8476
  LOG_DIR            default <repo>/logs; the log is LOG_DIR/worker-\$WORKER_ID.log (appended)
  SKIP_SETUP=1       do not run launch/setup.sh first
  DRY_RUN=1          print the setup and job commands instead of running them
EOF
}

case "${1:-}" in -h|--help) usage; exit 0 ;; esac

metadata() {
  [[ "${METADATA}" == "1" ]] && command -v curl >/dev/null 2>&1 || return 1
  curl -sf --max-time 2 -H 'Metadata-Flavor: Google' \
    "http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1"
}

# This worker's index and the slice's host list, as jax's cloud_tpu_cluster reads them.
worker_id="${WORKER_ID:-${TPU_WORKER_ID:-}}"
[[ -n "${worker_id}" ]] || worker_id="$(metadata agent-worker-number || true)"
worker_id="${worker_id:-0}"
[[ "${worker_id}" =~ ^[0-9]+$ ]] || die "worker id '${worker_id}' is not a number"

hosts_csv="${TPU_PROCESS_ADDRESSES:-${TPU_WORKER_HOSTNAMES:-}}"
if [[ -z "${hosts_csv}" ]]; then
  hosts_csv="$(metadata worker-network-endpoints || true)"
fi
hosts=()
if [[ -n "${hosts_csv}" ]]; then
  IFS=',' read -r -a entries <<< "${hosts_csv}"
  for e in "${entries[@]}"; do
    IFS=':' read -r -a parts <<< "${e}"
    # Either plain host names or the older name:id:ip triples.
    if ((${#parts[@]} == 3)); then hosts+=("${parts[2]}"); else hosts+=("${parts[0]}"); fi
  done
fi

dist=()
case "${DIST}" in
  env)
    if ((${#hosts[@]} > 1)); then
      ((worker_id < ${#hosts[@]})) || die "worker ${worker_id} is not among the ${#hosts[@]} hosts"
      dist=(--config.distributed.coordinator_address="${hosts[0]}:${COORDINATOR_PORT}"
            --config.distributed.num_processes="${#hosts[@]}"
            --config.distributed.process_id="${worker_id}")
    fi ;;
  auto) dist=(--config.distributed.auto=true) ;;
  none) ;;
  *) die "DIST=${DIST}: expected env, auto or none" ;;
esac

py="${VENV}/bin/python"
case "${ENTRY}" in
  main) cmd=("${py}" -m mtrl_jax.main "$@" "${dist[@]+"${dist[@]}"}") ;;
  sweep) cmd=("${py}" -m experiments.sweep "$@" --python "${py}" "${dist[@]+"${dist[@]}"}") ;;
  *) die "ENTRY=${ENTRY}: expected main or sweep" ;;
esac

[[ "${SKIP_SETUP}" == "1" ]] || VENV="${VENV}" DRY_RUN="${DRY_RUN}" bash "${LAUNCH_DIR}/setup.sh"

log="${LOG_DIR}/worker-${worker_id}.log"
if [[ "${DRY_RUN}" == "1" ]]; then
  echo "# worker ${worker_id} of ${#hosts[@]} host(s); log ${log}"
  run "${cmd[@]}"
  exit 0
fi
mkdir -p "${LOG_DIR}"
cd "${REPO_ROOT}"
{
  echo "=== $(date '+%F %T') $(hostname) worker ${worker_id} of ${#hosts[@]} host(s)"
  printf '=== %q ' "${cmd[@]}"; echo
} >> "${log}"
set +e
"${cmd[@]}" 2>&1 | tee -a "${log}"
rc="${PIPESTATUS[0]}"
set -e
echo "=== $(date '+%F %T') exit ${rc}" >> "${log}"
exit "${rc}"
