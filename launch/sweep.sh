#!/usr/bin/env bash
# Runs experiments/sweep.py on the TPU VM: run_all.sh with ENTRY=sweep, detached by default
# (a sweep outlives an ssh session; it is resumable, so relaunching after a preemption is safe).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF
usage: launch/sweep.sh --name NAME [--attach] [--] ARGS for python -m experiments.sweep
       launch/sweep.sh --name NAME --summarize ROOT     (prints the table, from worker 0's files)

  ARGS, e.g.: --config configs/grpo.py --grid 'estimator=grpo,rloo;horizon=3,6;seed=0,1' --root /data/sweep
  --attach     stay attached (DETACH=0); by default the sweep runs under nohup and the
               output is in logs/worker-\$ID.log on each worker and ROOT/<run>/log.txt
  On a multi-host slice every worker runs the same sweep in lockstep; ROOT must then be
  one folder all hosts see (a gcsfuse bucket), or the skip-if-done check disagrees.
${COMMON_USAGE}

example:
  TPU_NAME=mtrl-v4 launch/sweep.sh --config configs/grpo.py \\
      --grid 'estimator=grpo,rloo,return_to_go;horizon=3,6;seed=0,1,2' --root /home/\$USER/sweep
  TPU_NAME=mtrl-v4 launch/run_all.sh --raw 'tail -n 5 logs/worker-*.log'
EOF
}

DETACH="${DETACH:-1}"
SUMMARIZE=""
parse_common_flags "$@"
args=()
set -- "${REST[@]+"${REST[@]}"}"
while (($#)); do
  case "$1" in
    --attach) DETACH=0; shift ;;
    --summarize) SUMMARIZE="${2:?--summarize needs the sweep root}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
args+=("${PASSTHRU[@]+"${PASSTHRU[@]}"}")
require_name

common=(--name "${TPU_NAME}" --zone "${ZONE}" --remote_dir "${REMOTE_DIR}" --sync "${SYNC}")
[[ -z "${PROJECT}" ]] || common+=(--project "${PROJECT}")
if [[ -n "${SUMMARIZE}" ]]; then
  WORKERS=0 DRY_RUN="${DRY_RUN}" exec "${LAUNCH_DIR}/run_all.sh" "${common[@]}" \
    --raw "$(quote_words "${VENV:-.venv}/bin/python" -m experiments.summarize --root "${SUMMARIZE}")"
fi
((${#args[@]})) || { usage >&2; die "no sweep arguments (--config ... --grid ... --root ...)"; }
ENTRY=sweep DETACH="${DETACH}" DRY_RUN="${DRY_RUN}" exec "${LAUNCH_DIR}/run_all.sh" "${common[@]}" -- "${args[@]}"
