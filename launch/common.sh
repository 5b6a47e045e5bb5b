# Sourced by the launch/*.sh scripts: shared flags, DRY_RUN, code sync, ssh to all workers.
# Not meant to be run on its own.

LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${LAUNCH_DIR}/.." && pwd)"

# Shared settings: an env var, or the flag of the same name (flags win).
TPU_NAME="${TPU_NAME:-}"
ZONE="${ZONE:-us-central2-b}"
PROJECT="${PROJECT:-}"
REMOTE_DIR="${REMOTE_DIR:-mtrl_jax}"   # on each worker, relative to the ssh user's home
SYNC="${SYNC:-tar}"                    # tar: push this working tree | git: setup.sh clones REPO_URL | none
DRY_RUN="${DRY_RUN:-0}"
WORKERS="${WORKERS:-all}"              # which workers ssh_all reaches: all, or e.g. 0

COMMON_USAGE="common flags (or env vars):
  --name NAME        TPU_NAME     TPU VM name (required)
  --zone ZONE        ZONE         default us-central2-b
  --project P        PROJECT      default: gcloud's configured project
  --remote_dir D     REMOTE_DIR   repo folder on each worker, relative to \$HOME (default mtrl_jax)
  --sync MODE        SYNC         tar (push this tree) | git (clone REPO_URL on the host) | none
  (env only)         WORKERS      which workers ssh reaches (default all)
  --dry_run          DRY_RUN=1    print the gcloud commands instead of running them"

die() { echo "error: $*" >&2; exit 2; }

# run CMD...: runs CMD, or prints it (shell-quoted, one line, prefixed by '+') under DRY_RUN=1.
run() {
  if [[ "${DRY_RUN}" == "1" ]]; then
    printf '+'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}

# parse_common_flags "$@": consumes the shared flags, leaves the others in REST=(...);
# `--` ends flag parsing and what follows it goes, untouched, to PASSTHRU=(...).
parse_common_flags() {
  REST=()
  PASSTHRU=()
  while (($#)); do
    case "$1" in
      --name) TPU_NAME="${2:?--name needs a value}"; shift 2 ;;
      --name=*) TPU_NAME="${1#*=}"; shift ;;
      --zone) ZONE="${2:?--zone needs a value}"; shift 2 ;;
      --zone=*) ZONE="${1#*=}"; shift ;;
      --project) PROJECT="${2:?--project needs a value}"; shift 2 ;;
      --project=*) PROJECT="${1#*=}"; shift ;;
      --remote_dir) REMOTE_DIR="${2:?}"; shift 2 ;;
      --remote_dir=*) REMOTE_DIR="${1#*=}"; shift ;;
      --sync) SYNC="${2:?}"; shift 2 ;;
      --sync=*) SYNC="${1#*=}"; shift ;;
      --dry_run) DRY_RUN=1; shift ;;
      --) shift; PASSTHRU=("$@"); break ;;
      *) REST+=("$1"); shift ;;
    esac
  done
}

require_name() {
  [[ -n "${TPU_NAME}" ]] || die "no TPU name: set TPU_NAME=... or pass --name NAME (see --help)"
}

# The flags every `gcloud compute tpus tpu-vm` call gets.
gcloud_where() {
  GCLOUD_WHERE=(--zone="${ZONE}")
  [[ -z "${PROJECT}" ]] || GCLOUD_WHERE+=(--project="${PROJECT}")
}

# The remote command joined from words, each shell-quoted for the worker's bash.
quote_words() {
  local out="" w
  for w in "$@"; do out+="$(printf '%q' "${w}") "; done
  printf '%s' "${out% }"
}

# sync_code: pushes this working tree to every worker (SYNC=tar); SYNC_PREFIX is
# the remote shell snippet that unpacks it (empty for git/none).
sync_code() {
  gcloud_where
  SYNC_PREFIX="mkdir -p ${REMOTE_DIR}"
  case "${SYNC}" in
    tar)
      local tgz="${TMPDIR:-/tmp}/mtrl_jax-${TPU_NAME}.tgz"
      local remote_tgz="/tmp/mtrl_jax-${USER:-user}.tgz"
      # The venv, logs and workdirs stay where they are on the workers.
      run tar czf "${tgz}" --exclude=.git --exclude=.venv --exclude=logs --exclude=__pycache__ \
        --exclude=.pytest_cache --exclude=.hypothesis --exclude=workdirs --exclude=runs \
        -C "${REPO_ROOT}" .
      run gcloud compute tpus tpu-vm scp "${tgz}" "${TPU_NAME}:${remote_tgz}" --worker=all "${GCLOUD_WHERE[@]}"
      SYNC_PREFIX+=" && tar xzf ${remote_tgz} -C ${REMOTE_DIR}"
      ;;
    git)
      [[ -n "${REPO_URL:-}" ]] || die "SYNC=git needs REPO_URL (and optionally REF)"
      # setup.sh is not on the host yet: clone first, setup.sh then keeps it at REF.
      SYNC_PREFIX="{ test -d ${REMOTE_DIR}/.git || git clone -q $(printf '%q' "${REPO_URL}") ${REMOTE_DIR}; }"
      ;;
    none) ;;
    *) die "SYNC=${SYNC}: expected tar, git or none" ;;
  esac
}

# ssh_all REMOTE_SHELL_COMMAND: runs it on every worker (WORKERS) of the TPU VM, in REMOTE_DIR.
ssh_all() {
  gcloud_where
  run gcloud compute tpus tpu-vm ssh "${TPU_NAME}" "${GCLOUD_WHERE[@]}" --worker="${WORKERS}" \
    --command="${SYNC_PREFIX:-true} && cd ${REMOTE_DIR} && $1"
}

# Settings forwarded to the workers' environment (only those set here).
FORWARD_VARS=(ENTRY DIST COORDINATOR_PORT SKIP_SETUP FORCE_SETUP JAX_SPEC EXTRAS VENV PYTHON_BIN
  PIP_EXTRA_INDEX_URL REPO_URL REF LOG_DIR)

forward_env() {
  local out="" v
  for v in "${FORWARD_VARS[@]}"; do
    [[ -z "${!v:-}" ]] || out+="${v}=$(printf '%q' "${!v}") "
  done
  [[ -z "${REMOTE_ENV:-}" ]] || out+="${REMOTE_ENV} "
  printf '%s' "${out}"
}

no_passthru() {
  ((${#PASSTHRU[@]} == 0)) || die "unexpected arguments after --: ${PASSTHRU[*]}"
}
