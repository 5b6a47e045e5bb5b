#!/usr/bin/env bash
# The accelerator slice of the project in one prepared call (<= 9 minutes on
# one H100), each stage under its own timeout, each writing OUT/<stage>.json
# as it ends, then OUT/summary.json (every stage's record and the headline
# numbers) and OUT/logs.tar.gz (9 files: what a device call brings back).
#
#   bash benchmarks/device_check.sh [OUT_DIR]            # on the GPU machine (OUT_DIR default $OUT)
#   DRY_RUN=1 bash benchmarks/device_check.sh OUT_DIR    # CPU, every stage at a tiny size, GPU parts skipped
#   SMOL_STUDY=1 bash benchmarks/device_check.sh [OUT]   # weights, then the study on SmolLM2 (the rest skipped)
#   TEXTWORLD=1 bash benchmarks/device_check.sh [OUT]    # weights, then SmolLM2 on TextWorld (the rest skipped)
#   bash benchmarks/device_check.sh --cpu-tiny OUT_DIR   # the same as DRY_RUN=1
#
# Stages, in order (the learner last: it takes the time that is left):
#   weights        SmolLM2's HF folder: the GGUF joined from .device/gguf_part*
#                  and checked by SHA-256 (weights "real"), else random weights
#                  of its shape from .device/gguf_header (weights "random");
#                  benchmarks/weights_transfer.py, docs/accelerator.md
#   main_job       the README main job (configs/default.py); H100: 82 s
#   smol           configs/smol.py in bfloat16 on those weights, 16 RL updates:
#                  learning curve and seconds per update; H100 ~96 s measured
#                  with attention=xla before odd lengths were padded for cuDNN;
#                  now attention=auto (SMOL_ATTENTION=xla is the fallback)
#   bf16_mismatch  benchmarks/bf16_mismatch.py, if the tree has it
#   rollout        benchmarks/rollout.py at a 24-layer shape (d=896, Qwen2.5-0.5B's
#                  depth and width): continuous vs lockstep
#   learner        benchmarks/learner.py --run: MFU at T=8k, then the largest T
#                  (doubling) in the time left; read from its printed lines if
#                  the timeout stops it
#   smol_study     only with SMOL_STUDY=1, and then instead of every stage but
#                  weights (one call each: both do not fit one window):
#                  python -m experiments.study --model smol --parallel 8 on those weights
#                  (E1's claim cells and control at horizons 2 and 8, 2 seeds: 2 warm
#                  starts, 2 critics, 16 runs; estimate ~6 min, not yet run on a GPU);
#                  its records in logs.tar.gz (logs/smol_study_records/), its summary
#                  JSON line the stage's result. DRY_RUN: 1 seed, horizon 2, smoke size.
#   textworld      only with TEXTWORLD=1, and then instead of every stage but weights
#                  (a call of its own, as smol_study): benchmarks/textworld_smol.sh on
#                  those weights in bfloat16: SmolLM2's zero-shot success on 64 held-out
#                  coin-collector games (level 5), then SFT on walkthroughs and RL (its
#                  JSON line the stage's result). Needs textworld on the device (its
#                  wheels: docs/accelerator.md); skipped, naming it, without. Not yet
#                  run on a GPU. DRY_RUN: the 1-block cut at runlocal size.
# Run from the repository root. The wheels in .device/wheels (benchmarks/
# device_wheels.sh) are installed into $WORK/site first; mtrl_jax itself runs
# from PYTHONPATH=. (no install). Times: BUDGET_S (540) for the whole run;
# each stage's cap below is its H100 estimate with room, and no stage may eat
# into the LEARNER_MIN_S (100) kept for the learner. DRY_RUN: BUDGET_S 5400,
# every cap DRY_CAP_S (1800).
set -uo pipefail
if [[ "${1:-}" == "--cpu-tiny" ]]; then DRY_RUN=1; shift; fi
DRY_RUN=${DRY_RUN:-0}
out=${1:-${OUT:-/tmp/device_check}}
work=${WORK:-/tmp/device_check_work}
src=${DEVICE_SRC:-$PWD/.device}
LEARNER_MIN_S=${LEARNER_MIN_S:-100}
if [[ "$DRY_RUN" == 1 ]]; then  # a loaded 2-core CPU: generous caps, the same code paths
  c=${DRY_CAP_S:-1800}
  : "${BUDGET_S:=5400}" "${CAP_WEIGHTS:=$c}" "${CAP_MAIN:=$c}" "${CAP_SMOL:=$c}" "${CAP_MISMATCH:=$c}" \
    "${CAP_ROLLOUT:=$c}" "${CAP_SMOL_STUDY:=$c}" "${CAP_TEXTWORLD:=$c}"
fi
: "${BUDGET_S:=540}" "${CAP_WEIGHTS:=90}" "${CAP_MAIN:=130}" "${CAP_SMOL:=160}" "${CAP_MISMATCH:=60}" \
  "${CAP_ROLLOUT:=120}" "${CAP_LEARNER:=600}" "${CAP_SMOL_STUDY:=500}" "${CAP_TEXTWORLD:=500}"
SMOL_STUDY=${SMOL_STUDY:-0}
TEXTWORLD=${TEXTWORLD:-0}
SMOL_ATTENTION=${SMOL_ATTENTION:-auto}
mkdir -p "$out" "$work/logs"
out=$(cd "$out" && pwd)
rm -f "$out"/*.json "$out/logs.tar.gz"
start=$SECONDS
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [[ "$DRY_RUN" == 1 ]]; then
  export JAX_PLATFORMS=cpu
  LEARNER_MIN_S=0
fi
if [[ "$SMOL_STUDY" == 1 || "$TEXTWORLD" == 1 ]]; then LEARNER_MIN_S=0; fi  # no learner stage in this call
say() { echo "[device_check $(date -u +%H:%M:%S) +$((SECONDS - start))s] $*"; }

# The wheels the image lacks (CPython 3.12 builds: not for the dry run's python).
if [[ "$DRY_RUN" != 1 ]] && ls "$src"/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$work/site" "$src"/wheels/*.whl >"$work/logs/wheels.log" 2>&1 \
    && export PYTHONPATH=$PYTHONPATH:$work/site \
    || { say "wheel install failed:"; tail -n 5 "$work/logs/wheels.log"; }
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"; } \
  >"$work/gpu.txt"
python3 - "$work/env.json" "$DRY_RUN" "$work/gpu.txt" <<'EOF' || echo '{}' >"$work/env.json"
import json, platform, sys
out = {"dry_run": sys.argv[2] == "1", "gpu": open(sys.argv[3]).read().strip(), "python": platform.python_version()}
try:
  import jax, flax
  out.update(jax=jax.__version__, flax=flax.__version__, backend=jax.default_backend(),
             devices=[d.device_kind for d in jax.devices()])
except Exception as e:  # recorded, and the stages say what fails
  out["jax_error"] = repr(e)
json.dump(out, open(sys.argv[1], "w"))
EOF
say "env: $(cat "$work/env.json")"

# run_stage NAME CAP RESERVE WORKDIR CMD...: CMD under timeout min(CAP, budget left - RESERVE).
run_stage() {
  local name=$1 cap=$2 reserve=$3 wd=$4; shift 4
  local left=$((BUDGET_S - (SECONDS - start) - reserve))
  local t=$((cap < left ? cap : left))
  if ((t < 10)); then
    skip_stage "$name" "no time left in BUDGET_S=$BUDGET_S (${left}s after keeping ${reserve}s)"
    return
  fi
  say "$name: up to ${t}s: $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$t" "$@" >"$work/logs/$name.log" 2>&1
  local rc=$?
  python3 benchmarks/device_report.py stage "$name" --log "$work/logs/$name.log" --rc "$rc" \
    --seconds "$((SECONDS - t0))" --timeout "$t" ${wd:+--workdir "$wd"} --out "$out/$name.json"
  if ((rc != 0)); then say "$name: exit $rc; its log ends:"; tail -n 8 "$work/logs/$name.log"; fi
}
skip_stage() {
  say "$1: skipped ($2)"
  python3 benchmarks/device_report.py stage "$1" --skip "$2" --out "$out/$1.json" >/dev/null
}

# The logs' tarball and the summary: what every call ends with.
finish() {
  cp "$work/env.json" "$work/logs/env.json" 2>/dev/null
  tar -czf "$out/logs.tar.gz" -C "$work" logs
  local dry=(); [[ "$DRY_RUN" == 1 ]] && dry=(--dry-run)
  python3 benchmarks/device_report.py summary --dir "$out" --env "$work/env.json" --budget "$BUDGET_S" \
    --seconds "$((SECONDS - start))" "${dry[@]}"
  say "done: $out/summary.json"
}

hf=$work/smol_hf
rm -rf "$work/main" "$work/smol" "$hf"
if [[ "$DRY_RUN" == 1 ]]; then
  # One SmolLM2 block and a one-block main job: compiling is nearly all of the CPU dry run, and
  # the stages run the same code at any depth. The study call keeps the 2-block cut it was sized on.
  layers=(--layers 1); [[ "$SMOL_STUDY" == 1 ]] && layers=(--layers 2)
  tw_args=(runlocal=true --config.model.dtype=bfloat16)
  main_cfg=configs/default.py:runlocal=true
  smol_cfg="configs/smol.py:hf_dir=$hf,runlocal=true"
  tiny_run=(--config.rl.steps=2 --config.sft.steps=2 --config.eval.tasks=2 --config.demos.episodes=16)
  main_tiny=(--config.model.n_layers=1)
  rollout_args=(--tasks 2 --group 2 --rows 2 --reps 1 --dim 32 --layers 1 --max_turns 2 --budget 16
                --latency_ms 1 --prompt_chars 40)
  mismatch_args=(--tiny)
  study_args=(--runlocal --seeds 1 --horizons 2 --in_process --config.rl.steps=2)
else
  layers=()
  main_cfg=configs/default.py
  smol_cfg="configs/smol.py:hf_dir=$hf"
  tiny_run=()
  main_tiny=()
  rollout_args=(--layers 24 --dim 896 --rows 16 --reps 1 --warmups 1)
  mismatch_args=()
  study_args=(--parallel 8)
  tw_args=(level=5 --config.model.dtype=bfloat16 --config.model.attention="$SMOL_ATTENTION")
fi

run_stage weights "$CAP_WEIGHTS" "$LEARNER_MIN_S" "" \
  python3 benchmarks/weights_transfer.py materialize --src "$src" --out "$hf" --work "$work" "${layers[@]}"

if [[ "$TEXTWORLD" == 1 ]]; then
  # SmolLM2 on TextWorld in this call, every other stage in a call of their own.
  if [[ ! -f "$hf/config.json" ]]; then
    skip_stage textworld "no SmolLM2 folder: the weights stage failed"
  elif ! python3 -c "import textworld" 2>/dev/null; then
    skip_stage textworld "textworld is not importable here: bring its wheels (docs/accelerator.md, TextWorld)"
  else
    rm -rf "$work/textworld"
    run_stage textworld "$CAP_TEXTWORLD" 0 "" \
      bash benchmarks/textworld_smol.sh "$hf" "$work/textworld" "${tw_args[@]}"
  fi
  for s in main_job smol bf16_mismatch rollout learner smol_study; do
    skip_stage "$s" "TEXTWORLD=1: this call runs SmolLM2 on TextWorld (the default call runs this stage)"
  done
  finish
  exit 0
fi
skip_stage textworld "TEXTWORLD=0: SmolLM2 on TextWorld runs in a call of its own (TEXTWORLD=1)"

if [[ "$SMOL_STUDY" == 1 ]]; then
  # The study on SmolLM2 in this call, every other stage in a call of their own (the default).
  if [[ -f "$hf/config.json" ]]; then
    rm -rf "$work/smol_study" "$work/logs/smol_study_records"
    run_stage smol_study "$CAP_SMOL_STUDY" 0 "" \
      python3 -m experiments.study --model smol --root "$work/smol_study" --hf_dir "$hf" \
      --records "$work/logs/smol_study_records" "${study_args[@]}"
  else
    skip_stage smol_study "no SmolLM2 folder: the weights stage failed"
  fi
  for s in main_job smol bf16_mismatch rollout learner; do
    skip_stage "$s" "SMOL_STUDY=1: this call runs the study on SmolLM2 (the default call runs this stage)"
  done
  finish
  exit 0
fi
skip_stage smol_study "SMOL_STUDY=0: the study on SmolLM2 runs in a call of its own (SMOL_STUDY=1)"

run_stage main_job "$CAP_MAIN" "$LEARNER_MIN_S" "$work/main" \
  python3 -m mtrl_jax.main --config="$main_cfg" --workdir="$work/main" "${tiny_run[@]}" "${main_tiny[@]}"

if [[ -f "$hf/config.json" ]]; then
  run_stage smol "$CAP_SMOL" "$LEARNER_MIN_S" "$work/smol" \
    python3 -m mtrl_jax.main --config="$smol_cfg" --workdir="$work/smol" --config.model.dtype=bfloat16 \
    --config.model.attention="$SMOL_ATTENTION" "${tiny_run[@]}"
else
  skip_stage smol "no SmolLM2 folder: the weights stage failed"
fi

if [[ -f benchmarks/bf16_mismatch.py ]]; then
  hf_arg=()  # on the device: the SmolLM2 folder the smol stage ran (all 30 blocks, real weights if they came)
  if [[ "$DRY_RUN" != 1 && -f "$hf/config.json" ]]; then hf_arg=(--hf_dir "$hf"); fi
  run_stage bf16_mismatch "$CAP_MISMATCH" "$LEARNER_MIN_S" "" \
    python3 benchmarks/bf16_mismatch.py "${mismatch_args[@]}" "${hf_arg[@]}" --attention "$SMOL_ATTENTION"
else
  skip_stage bf16_mismatch "benchmarks/bf16_mismatch.py is not in this tree"
fi

run_stage rollout "$CAP_ROLLOUT" "$LEARNER_MIN_S" "" python3 benchmarks/rollout.py "${rollout_args[@]}"

if [[ "$DRY_RUN" == 1 ]]; then
  skip_stage learner "dry run: the learner at T=8k and beyond needs an accelerator"
else
  run_stage learner "$CAP_LEARNER" 5 "" \
    python3 benchmarks/learner.py --run --skip-cpu-report --max-t "${MAX_T:-131072}"
fi

finish
