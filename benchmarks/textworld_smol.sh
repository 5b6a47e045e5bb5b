#!/usr/bin/env bash
# SmolLM2-135M-Instruct on a TextWorld setting (configs/textworld.py:model=smol): the chat model's
# zero-shot success (no training: the eval stage alone), then demos of the walkthrough, SFT and RL
# in one run (its step-0 evaluation is the SFT policy, its final one the RL policy). Prints one
# JSON line: zero_shot, after_sft, after_rl (sampled success on the held-out games) and the workdirs.
#
#   bash benchmarks/textworld_smol.sh HF_DIR WORKDIR [CONFIG_ARGS] [--config.x=y ...]
#   bash benchmarks/textworld_smol.sh ~/.cache/mtrl_jax/SmolLM2-135M-Instruct /tmp/tw_smol level=5
# (benchmarks/device_check.sh runs it as its `textworld` stage with TEXTWORLD=1.)
set -euo pipefail
hf=$1 wd=$2 args=${3:-}
shift $(($# < 3 ? $# : 3))
if ! python3 -c "import textworld" 2>/dev/null; then
  echo '{"error": "textworld is not importable: pip install -e \".[benchmarks]\""}'
  exit 3
fi
cfg="configs/textworld.py:model=smol,hf_dir=$hf${args:+,$args}"
python3 -m mtrl_jax.main --config="$cfg" --workdir="$wd/zero_shot" --config.stages='("eval",)' "$@"
python3 -m mtrl_jax.main --config="$cfg" --workdir="$wd/trained" "$@"
python3 - "$wd" <<'PY'
import json, os, sys
wd = sys.argv[1]
def recs(run):
  path = os.path.join(wd, run, "metrics.jsonl")
  return [json.loads(l) for l in open(path) if l.strip().startswith("{")] if os.path.exists(path) else []
def final(rs):
  return next((r for r in reversed(rs) if r.get("stage") == "eval" and "eval/success" in r), {})
zero, trained = recs("zero_shot"), recs("trained")
sft = next((r for r in trained if r.get("stage") == "rl" and r.get("step") == 0 and "eval/success" in r), {})
rl = final(trained)
print(json.dumps({"zero_shot": final(zero).get("eval/success"), "after_sft": sft.get("eval/success"),
                  "after_rl": rl.get("eval/success"), "tokens_per_session": rl.get("eval/tokens_per_session"),
                  "workdir": wd}))
PY
