#!/usr/bin/env bash
# Runs the job on every worker of a TPU VM: push code, then per worker
# launch/run_worker.sh (bootstrap + python -m mtrl_jax.main, log in logs/worker-$ID.log).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DETACH="${DETACH:-0}"

usage() {
  cat <<EOF
usage: launch/run_all.sh --name NAME [flags] [--] ARGS for mtrl_jax.main
       launch/run_all.sh --name NAME --raw 'SHELL COMMAND'   (any command, in the repo, on all workers)

Runs: gcloud compute tpus tpu-vm ssh NAME --zone=Z --worker=all --command='... bash launch/run_worker.sh ARGS'

  --detach           DETACH=1   start under nohup and return; follow with --raw 'tail -f logs/worker-0.log'
  --raw CMD                     run CMD on every worker instead of the job (no sync, no bootstrap)
  forwarded to the workers when set: ENTRY DIST COORDINATOR_PORT SKIP_SETUP FORCE_SETUP JAX_SPEC
  EXTRAS VENV PYTHON_BIN PIP_EXTRA_INDEX_URL REPO_URL REF LOG_DIR, plus REMOTE_ENV='K=V ...'
${COMMON_USAGE}

example:
  TPU_NAME=mtrl-v4 launch/run_all.sh --config=configs/grpo.py:estimator=rloo,horizon=6 \\
      --workdir=/home/\$USER/runs/rloo-h6 --config.rl.steps=200
EOF
}

RAW=""
parse_common_flags "$@"
args=()
set -- "${REST[@]+"${REST[@]}"}"
while (($#)); do
  case "$1" in
    --detach) DETACH=1; shift ;;
    --raw) RAW="${2:?--raw needs a command}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
args+=("${PASSTHRU[@]+"${PASSTHRU[@]}"}")
require_name

if [[ -n "${RAW}" ]]; then
  SYNC_PREFIX="true"
  ssh_all "${RAW}"
  exit 0
fi
((${#args[@]})) || { usage >&2; die "no job arguments (e.g. --config=... --workdir=...)"; }

sync_code
job="bash launch/run_worker.sh $(quote_words "${args[@]}")"
if [[ "${DETACH}" == "1" ]]; then
  # Survives the ssh session; the per-worker log is the only output.
  job="nohup ${job} > /dev/null 2>&1 < /dev/null &"
fi
job="$(forward_env)${job}"
ssh_all "${job}"
