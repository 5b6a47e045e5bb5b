"""The third round's pilot (issue 41, docs/STUDY_ROUND3.md): can the graded control be seen on delayed(cue)?

Every run is a configs/study.py cell of round 3's probe (delayed with the cue, draws salted by the seed)
started from one of issue 43's critic warm starts (experiments/critic_probe.py: the policy warm start of
its horizon plus a critic at the bar, which the GAE arms take); the graded control is `dshuffle=q`.

  python -m experiments.study.pilot3 --out OUT --init 2:0=DIR --init 2:1=DIR ...  # runs what is missing
  python -m experiments.study.pilot3 --out OUT --table                            # the table from OUT
  python -m experiments.study.pilot3 --out OUT --init 2:2=DIR --only h2_s2_gae_q1  # named runs only

`--init H:SEED=DIR`: the critic warm start (critic_probe's `critic,h=H,seed=SEED` folder) of that
horizon and seed. Each run is a subprocess (`python -m mtrl_jax.main`), its wall and CPU seconds kept
in OUT/<run>/times.json; a run whose folder holds `done` is skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

# (run name, horizon, seed, configs/study.py arguments beyond the probe's, extra --config flags)
RUNS = tuple(
    [(f"h2_s{s}_{n}", 2, s, a, ()) for s in (0, 1, 2) for n, a in (
        ("ms_grpo", "arm=ms_grpo"), ("ms_grpo_q1", "arm=ms_grpo,dshuffle=1.0"),
        ("ms_grpo_q0.5", "arm=ms_grpo,dshuffle=0.5"), ("ms_grpo_q0.25", "arm=ms_grpo,dshuffle=0.25"))]
    + [(f"h2_s{s}_{n}", 2, s, a, ()) for s in (0, 1, 2) for n, a in (
        ("gae", "arm=gae_lambda0.95"), ("gae_q1", "arm=gae_lambda0.95,dshuffle=1.0"),
        ("gae_q0.5", "arm=gae_lambda0.95,dshuffle=0.5"), ("gae_q0.25", "arm=gae_lambda0.95,dshuffle=0.25"))]
    + [("h8_s0_ms_grpo_lr1e-3", 8, 0, "arm=ms_grpo", ("--config.rl.lr=1e-3",)),
       ("h8_s0_ms_grpo_64", 8, 0, "arm=ms_grpo", ("--config.rl.steps=64", "--config.eval.every=32")),
       ("h8_s0_gae", 8, 0, "arm=gae_lambda0.95", ()),
       ("h8_s0_gae_lr1.5e-3", 8, 0, "arm=gae_lambda0.95", ("--config.rl.lr=1.5e-3",))])


def command(name: str, h: int, seed: int, args: str, extra: tuple, out: str, init: str) -> list[str]:
  cell = f"configs/study.py:probe=delayed,horizon={h},seed={seed},cue=true,draws=true,{args}"
  return [sys.executable, "-m", "mtrl_jax.main", f"--config={cell}", f"--workdir={os.path.join(out, name)}",
          f"--config.init_from={init}", *extra]


def run(out: str, inits: dict, only: tuple = ()) -> None:
  """Runs the pilot's runs that have a warm start in `inits` (and are named in `only`, if given)."""
  unknown = sorted(set(only) - {r[0] for r in RUNS})
  if unknown:
    raise ValueError(f"--only {unknown}: not pilot runs; the runs are {[r[0] for r in RUNS]}")
  for name, h, seed, args, extra in RUNS:
    wd = os.path.join(out, name)
    if os.path.exists(os.path.join(wd, "done")) or (h, seed) not in inits or (only and name not in only):
      continue
    cmd = command(name, h, seed, args, extra, out, inits[(h, seed)])
    print(" ".join(cmd), flush=True)
    t, cpu0 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.path.join(wd, "times.json"), "w") as f:
      json.dump({"wall_s": time.time() - t, "cpu_s": cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime,
                 "load": os.getloadavg()}, f)
    open(os.path.join(wd, "done"), "w").close()


def evals(wd: str) -> list[tuple]:
  """(step, sampled success, share following the sign, invalid actions in the last update) per RL eval."""
  rows = [json.loads(line) for line in open(os.path.join(wd, "metrics.jsonl"))]
  inv = [r["ledger/invalid_actions"] / r["ledger/turns"] for r in rows if r.get("stage") == "rl" and "ledger/turns" in r]
  # The eval names only the decision kinds it saw: no `decision_cued` beside `decision_uncued` is a share of 0.
  return [(r["step"], r["eval/success"], r.get("eval/decision_cued", 0.0 if "eval/decision_uncued" in r else None),
           inv[-1] if inv else None) for r in rows if r.get("stage") == "rl" and "eval/success" in r]


def table(out: str) -> str:
  lines = ["| run | H | seed | step 0: success (follows the sign) | final: success (follows) | invalid turns, "
           "last update | wall s / CPU s |", "|---|---:|---:|---|---|---:|---|"]
  for name, h, seed, _, _ in RUNS:
    wd = os.path.join(out, name)
    if not os.path.exists(os.path.join(wd, "metrics.jsonl")):
      continue
    e = evals(wd)
    t = json.load(open(os.path.join(wd, "times.json"))) if os.path.exists(os.path.join(wd, "times.json")) else {}
    secs = f"{t['wall_s']:.0f} / {t['cpu_s']:.0f}" if t else "-"
    lines.append(f"| {name} | {h} | {seed} | {e[0][1]:.3f} ({e[0][2]:.3f}) | {e[-1][1]:.3f} ({e[-1][2]:.3f}) at "
                 f"{e[-1][0]} | {e[-1][3]:.3f} | {secs} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m experiments.study.pilot3", description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True)
  p.add_argument("--init", action="append", default=[], help="H:SEED=DIR, the critic warm start of that cell")
  p.add_argument("--table", action="store_true")
  p.add_argument("--only", action="append", default=[], help="a run's name: run only the runs named (repeatable)")
  a = p.parse_args(argv)
  if a.table:
    print(table(a.out))
    print(json.dumps(_summary(a.out)))
    return 0
  inits = {}
  for spec in a.init:
    key, _, path = spec.partition("=")
    h, _, s = key.partition(":")
    inits[(int(h), int(s))] = path
  run(a.out, inits, tuple(a.only))
  print(table(a.out))
  print(json.dumps(_summary(a.out)))
  return 0


def _summary(out: str) -> dict:
  """The JSON line a script ends with: how many of the pilot's runs are done in OUT."""
  return {"runs": len(RUNS), "done": sum(os.path.exists(os.path.join(out, r[0], "done")) for r in RUNS)}


if __name__ == "__main__":
  sys.exit(main())
