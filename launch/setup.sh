#!/usr/bin/env bash
# Per-host bootstrap: repo in place, a venv, the package with TPU JAX. Idempotent:
# a second run with the same setup.py and JAX_SPEC only checks and returns.
#
# On a host (what run_worker.sh calls first):   bash launch/setup.sh
# From your machine, on every worker at once:   TPU_NAME=x launch/setup.sh --all
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"


usage() {
  cat <<EOF
usage: launch/setup.sh [--all] [--force]

Without --all: bootstraps THIS host (run on a TPU VM worker):
  1. repo: if REPO_URL is set and REF given, clone/fetch and check out REF (else use this tree)
  2. venv at VENV (default <repo>/.venv) with python >= 3.11 (uv fetches one if the image lacks it)
  3. pip install -e ".[EXTRAS]" and "JAX_SPEC", skipped when the stamp in the venv says done
With --all: pushes this tree to every worker and runs the bootstrap there (gcloud ... --worker=all).

env: VENV, JAX_SPEC (default 'jax[tpu]'), EXTRAS (default dev; 'none' for none),
     PIP_EXTRA_INDEX_URL (default the CPU torch index), REPO_URL, REF, FORCE_SETUP=1 (--force)
${COMMON_USAGE}
EOF
}

ALL=0
parse_common_flags "$@"
set -- "${REST[@]+"${REST[@]}"}"
while (($#)); do
  case "$1" in
    --all) ALL=1; shift ;;
    --force) export FORCE_SETUP=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
no_passthru

if [[ "${ALL}" == "1" ]]; then
  require_name
  sync_code
  # Only what was set here travels; the defaults below are resolved on each host.
  ssh_all "$(forward_env)bash launch/setup.sh"
  exit 0
fi

VENV="${VENV:-${REPO_ROOT}/.venv}"
JAX_SPEC="${JAX_SPEC:-jax[tpu]}"
EXTRAS="${EXTRAS:-dev}"
# The dev extras pull torch (the HF parity oracle); the CPU wheel is enough and far smaller.
PIP_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
FORCE_SETUP="${FORCE_SETUP:-0}"

say() { echo "[setup $(hostname)] $*" >&2; }

# 1. The code. With SYNC=tar the tree was pushed already; REPO_URL+REF pins a commit.
if [[ -n "${REPO_URL:-}" ]]; then
  if [[ ! -d "${REPO_ROOT}/.git" ]]; then
    die "REPO_URL is set but ${REPO_ROOT} is not a git checkout; clone it first (SYNC=git does)"
  fi
  if [[ -n "${REF:-}" ]]; then
    run git -C "${REPO_ROOT}" fetch -q origin
    run git -C "${REPO_ROOT}" checkout -q "${REF}"
  fi
fi
[[ -f "${REPO_ROOT}/setup.py" ]] || die "no setup.py in ${REPO_ROOT}"

# 2. The venv: JAX >= 0.7 needs python >= 3.11, which older TPU images lack.
if [[ ! -x "${VENV}/bin/python" ]]; then
  py="${PYTHON_BIN:-}"
  if [[ -z "${py}" ]]; then
    for cand in python3.13 python3.12 python3.11; do
      if command -v "${cand}" >/dev/null 2>&1; then py="${cand}"; break; fi
    done
  fi
  if [[ -n "${py}" ]] && "${py}" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    say "creating ${VENV} with ${py}"
    run "${py}" -m venv "${VENV}"
  else
    say "no python >= 3.11 with venv here; using uv to fetch one"
    command -v uv >/dev/null 2>&1 || run python3 -m pip install -q --user uv
    run "$(command -v uv || echo "${HOME}/.local/bin/uv")" venv -q --seed --python 3.11 "${VENV}"
  fi
fi

# 3. The packages, once per (setup.py, JAX_SPEC, EXTRAS).
stamp_file="${VENV}/.mtrl_setup_stamp"
stamp="$( { cat "${REPO_ROOT}/setup.py"; echo "${JAX_SPEC}|${EXTRAS}"; } | sha256sum | cut -c1-16)"
if [[ "${FORCE_SETUP}" != "1" && -f "${stamp_file}" && "$(cat "${stamp_file}")" == "${stamp}" ]]; then
  say "packages up to date (stamp ${stamp}); FORCE_SETUP=1 reinstalls"
else
  pip=("${VENV}/bin/python" -m pip install -q --extra-index-url "${PIP_EXTRA_INDEX_URL}")
  run "${VENV}/bin/python" -m pip install -q -U pip
  target="${REPO_ROOT}"
  [[ "${EXTRAS}" == "none" ]] || target+="[${EXTRAS}]"
  run "${pip[@]}" -e "${target}"
  # After the package, so that its plain `jax` requirement does not shadow the TPU build.
  run "${pip[@]}" -U "${JAX_SPEC}"
  if [[ "${DRY_RUN}" != "1" ]]; then
    # Import only: touching the devices would block on a pod until every host joins.
    check='import jax, importlib.util as u; print("jax", jax.__version__)'
    [[ "${JAX_SPEC}" != *tpu* ]] || check+='; assert u.find_spec("libtpu"), "libtpu missing"'
    "${VENV}/bin/python" -c "${check}" >&2 || die "jax does not import in ${VENV}"
    echo "${stamp}" > "${stamp_file}"
  fi
fi
say "ready: ${VENV}/bin/python"
