#!/usr/bin/env bash
# The main job as N local JAX processes on one machine (the CPU recipe of a multi-host run).
#
#   launch/local.sh 2 --config=configs/default.py:runlocal=true --workdir=/tmp/mtrl_2proc
#   DEVICES=4 launch/local.sh 2 --config=... --workdir=...   # 4 fake CPU devices per process
#
# Each process gets the MTRL_* variables (coordinator on 127.0.0.1, its rank)
# and, on CPU, DEVICES fake devices; it logs to <workdir>/logs/process-<rank>.log.
# If one process fails, the others are given GRACE_S seconds to exit on their
# own (they stop at their next collective) and are then killed; the script
# exits with the first non-zero code. Relaunching the same command resumes
# from the workdir's last checkpoint.
set -euo pipefail

usage() {
  cat <<EOF
usage: launch/local.sh NUM_PROCESSES ARGS for mtrl_jax.main (--config=... --workdir=... required)

env:
  DEVICES=4        fake CPU devices per process (XLA_FLAGS); 0 leaves XLA_FLAGS alone
  PORT=<free>      the coordinator's port on 127.0.0.1 (default: a free one)
  PLATFORM=cpu     JAX_PLATFORMS for every process ('' leaves it alone)
  GRACE_S=150      after a failure, seconds before the remaining processes are killed
  PYTHON=python3   the interpreter
  DRY_RUN=1        print each process's command line instead of running it
EOF
}

case "${1:-}" in -h|--help|"") usage; [[ -n "${1:-}" ]]; exit $? ;; esac
num="$1"; shift
[[ "${num}" =~ ^[1-9][0-9]*$ ]] || { echo "local.sh: NUM_PROCESSES must be a positive integer, got '${num}'" >&2; exit 2; }

workdir=""
for a in "$@"; do
  case "${a}" in --workdir=*) workdir="${a#--workdir=}" ;; esac
done
[[ -n "${workdir}" ]] || { echo "local.sh: pass --workdir=DIR (the logs go to DIR/logs)" >&2; exit 2; }

PYTHON="${PYTHON:-python3}"
DEVICES="${DEVICES:-4}"
PLATFORM="${PLATFORM-cpu}"
GRACE_S="${GRACE_S:-150}"
PORT="${PORT:-$("${PYTHON}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
logs="${workdir}/logs"

cmd=("${PYTHON}" -m mtrl_jax.main "$@")
if [[ "${DRY_RUN:-0}" == "1" ]]; then
  for ((rank = 0; rank < num; rank++)); do
    echo "MTRL_COORDINATOR_ADDRESS=127.0.0.1:${PORT} MTRL_NUM_PROCESSES=${num} MTRL_PROCESS_ID=${rank}" \
         "${DEVICES:+XLA_FLAGS=--xla_force_host_platform_device_count=${DEVICES}}" \
         "${cmd[*]} > ${logs}/process-${rank}.log"
  done
  exit 0
fi

mkdir -p "${logs}"
pids=()
for ((rank = 0; rank < num; rank++)); do
  (
    cd "${REPO_ROOT}"
    export MTRL_COORDINATOR_ADDRESS="127.0.0.1:${PORT}" MTRL_NUM_PROCESSES="${num}" MTRL_PROCESS_ID="${rank}"
    export PYTHONUNBUFFERED=1
    [[ -z "${PLATFORM}" ]] || export JAX_PLATFORMS="${PLATFORM}"
    [[ "${DEVICES}" == "0" ]] || export XLA_FLAGS="--xla_force_host_platform_device_count=${DEVICES}"
    echo "# $(date -u +%FT%TZ) process ${rank} of ${num}: ${cmd[*]}"
    exec "${cmd[@]}"
  ) >> "${logs}/process-${rank}.log" 2>&1 &
  pids+=($!)
done
echo "local.sh: ${num} processes (pids ${pids[*]}), coordinator 127.0.0.1:${PORT}, logs in ${logs}/" >&2

kill_all() { for p in "${pids[@]}"; do kill -9 "${p}" 2>/dev/null || true; done; }
trap 'kill_all; exit 130' INT TERM

status=0
failed_at=""
remaining=${num}
while ((remaining > 0)); do
  remaining=0
  for i in "${!pids[@]}"; do
    p="${pids[$i]}"
    [[ -n "${p}" ]] || continue
    if kill -0 "${p}" 2>/dev/null; then
      remaining=$((remaining + 1))
      continue
    fi
    code=0
    wait "${p}" || code=$?
    pids[$i]=""
    echo "local.sh: process ${i} exited with ${code}" >&2
    if ((code != 0)) && ((status == 0)); then
      status=${code}
      failed_at=$(date +%s)
    fi
  done
  if [[ -n "${failed_at}" ]] && (($(date +%s) - failed_at > GRACE_S)); then
    echo "local.sh: killing the processes still running ${GRACE_S}s after a failure" >&2
    kill_all
    break
  fi
  sleep 1
done
exit "${status}"
