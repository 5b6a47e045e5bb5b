"""A grid of `configs/<family>.py:ARGS` runs, one workdir each, resumable.

  python -m experiments.sweep --config configs/grpo.py \\
      --grid 'estimator=grpo,rloo;horizon=3,6;seed=0,1' --root /tmp/sweep [--dry_run] [--parallel N]

`;` separates keys, `,` separates a key's values; the product of all values
gives one run per point, named `k=v,k=v` after the grid (`ROOT/estimator=grpo,
horizon=3,seed=0`). Fixed args ride on the config (`configs/grpo.py:env=keydoor`)
and any `--config.FIELD=VALUE` flag is passed to every run:

  python -m experiments.sweep --config configs/grpo.py:runlocal=true --grid 'seed=0,1,2' \\
      --root /tmp/s --config.rl.steps=5

Judging a recipe: `--seeds N` adds seed=0..N-1 to the grid (or is the whole
grid), and at the end the sweep prints every run's final sampled eval success
with min / median / max over the runs, and, with `--bar`, the eval step at
which each run first reached the bar and its lowest eval after that (a recipe
that gets there and falls back is not robust):

  python -m experiments.sweep --config configs/default.py --seeds 5 --root /tmp/seeds --bar 0.95

A run whose metrics.jsonl already has a final line (stage `eval`) is skipped,
so relaunching the same command after a preemption finishes the grid; each
unfinished run resumes from its own checkpoint. Each run's stdout and stderr
are appended to ROOT/<name>/log.txt. Then: `python -m experiments.summarize --root ROOT`.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import os
import shlex
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_grid(grid: str) -> list[tuple[str, list[str]]]:
  """'a=1,2;b=x' -> [('a', ['1', '2']), ('b', ['x'])], in the order written."""
  out, seen = [], set()
  for part in grid.split(";"):
    part = part.strip()
    if not part:
      continue
    if "=" not in part:
      raise ValueError(f"grid part {part!r} is not key=v1,v2,...")
    key, values = part.split("=", 1)
    key = key.strip()
    vals = [v.strip() for v in values.split(",")]
    if not key or key in seen:
      raise ValueError(f"grid key {key!r} is empty or repeated")
    if not all(vals) or any("/" in v or ":" in v for v in vals):
      raise ValueError(f"grid values of {key!r} must be non-empty and free of '/' and ':': {values!r}")
    seen.add(key)
    out.append((key, vals))
  if not out:
    raise ValueError("empty grid")
  return out


def expand(config: str, grid: str) -> list[tuple[str, str]]:
  """(run name, full `--config` value) for each point of the grid."""
  path, _, fixed = config.partition(":")
  keys = parse_grid(grid)
  fixed_keys = {p.split("=", 1)[0] for p in fixed.split(",") if p}
  if clash := fixed_keys & {k for k, _ in keys}:
    raise ValueError(f"{sorted(clash)} set both in --config and in --grid")
  runs = []
  for values in itertools.product(*(v for _, v in keys)):
    name = ",".join(f"{k}={v}" for (k, _), v in zip(keys, values))
    runs.append((name, f"{path}:{','.join(p for p in (fixed, name) if p)}"))
  return runs


def is_done(workdir: str) -> bool:
  """True when metrics.jsonl holds a line of the final `eval` stage."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    for line in f:
      try:
        if json.loads(line).get("stage") == "eval":
          return True
      except json.JSONDecodeError:  # a half-written line from a killed run
        continue
  return False


def eval_curve(workdir: str) -> tuple[list[tuple[int, float]], float | None]:
  """([(rl step, eval/success)] of the RL stage, final eval/success or None) of one run."""
  from mtrl_jax.metrics import read_metrics
  if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    return [], None
  curve, final = {}, None
  for r in read_metrics(workdir):
    if r.get("eval/success") is None:
      continue
    if r.get("stage") == "rl":
      curve[int(r["step"])] = float(r["eval/success"])  # a resumed run's rewritten step replaces the old
    elif r.get("stage") == "eval":
      final = float(r["eval/success"])
  return sorted(curve.items()), final


def seed_report(runs: list[tuple[str, str]], bar: float | None) -> dict:
  """Final eval success per run and min / median / max over the finished ones (see module doc)."""
  per_run = {}
  for name, workdir in runs:
    curve, final = eval_curve(workdir)
    row = {"final": final}
    if bar is not None:  # the RL evals, then the final one (64+ tasks) as step "final"
      points = curve + ([("final", final)] if final is not None else [])
      first = next((i for i, (_, v) in enumerate(points) if v >= bar), None)
      row["first_at_bar"] = None if first is None else points[first][0]
      row["min_after_bar"] = None if first is None else min(v for _, v in points[first:])
    per_run[name] = row
  finals = sorted(r["final"] for r in per_run.values() if r["final"] is not None)
  out = {"runs": len(runs), "finished": len(finals), "per_run": per_run}
  if finals:
    n = len(finals)
    median = finals[n // 2] if n % 2 else 0.5 * (finals[n // 2 - 1] + finals[n // 2])
    out["eval_success"] = {"min": finals[0], "median": median, "max": finals[-1]}
  if bar is not None:
    out["bar"] = bar
    out["all_reached_bar"] = bool(finals) and all(r["first_at_bar"] is not None for r in per_run.values())
  return out


def print_seed_report(rep: dict) -> None:
  bar = rep.get("bar")
  head = "| run | final eval/success |" + (f" first eval >= {bar} at step | lowest eval after |" if bar else "")
  print("\n" + head)
  print("|---|---:|" + ("---:|---:|" if bar else ""))
  for name, r in rep["per_run"].items():
    cells = ["—" if r["final"] is None else f"{r['final']:.3f}"]
    if bar is not None:
      cells += ["never" if r["first_at_bar"] is None else str(r["first_at_bar"]),
                "—" if r["min_after_bar"] is None else f"{r['min_after_bar']:.3f}"]
    print(f"| {name} | " + " | ".join(cells) + " |")
  if "eval_success" in rep:
    e = rep["eval_success"]
    print(f"final eval/success over {rep['finished']} of {rep['runs']} runs: min {e['min']:.3f}, "
          f"median {e['median']:.3f}, max {e['max']:.3f}")


def command(python: str, config: str, workdir: str, overrides: list[str]) -> list[str]:
  return [python, "-m", "mtrl_jax.main", f"--config={config}", f"--workdir={workdir}", *overrides]


def run_one(name: str, cmd: list[str], workdir: str) -> tuple[str, int, float]:
  os.makedirs(workdir, exist_ok=True)
  t0 = time.time()
  with open(os.path.join(workdir, "log.txt"), "a") as log:
    log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n")
    log.flush()
    rc = subprocess.call(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
  return name, rc, time.time() - t0


def run_job(name: str, cmd: list[str], workdir: str, in_process: bool = False) -> tuple[str, int, float]:
  """One job as `run_one` runs it; with `in_process`, a main-job command runs in this process
  instead (mtrl_jax/inprocess.py: the same run, output to the same log.txt), reusing the
  programs earlier runs here compiled. Other commands (the lab) still get their own process."""
  if not (in_process and "mtrl_jax.main" in cmd):
    return run_one(name, cmd, workdir)
  from mtrl_jax import inprocess
  os.makedirs(workdir, exist_ok=True)
  rc, secs = inprocess.run_argv(inprocess.argv_of(cmd), log_path=os.path.join(workdir, "log.txt"))
  return name, rc, secs


def run_jobs(jobs, parallel: int, in_process: bool = False):
  """Yields (name, rc, seconds) of each (name, cmd, workdir) job as it ends: `parallel` processes
  at once, or (in_process) one after another in this process, on its main thread."""
  if in_process:
    for job in jobs:
      yield run_job(*job, in_process=True)
    return
  with cf.ThreadPoolExecutor(parallel) as pool:
    futures = [pool.submit(run_one, *job) for job in jobs]
    for fut in cf.as_completed(futures):
      yield fut.result()


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", required=True, help="configs/<family>.py[:fixed args], relative to the repo")
  p.add_argument("--grid", default="", help="'key=v1,v2;key2=w1,w2' (product of all)")
  p.add_argument("--seeds", type=int, default=0, help="add seed=0..N-1 to the grid")
  p.add_argument("--bar", type=float, default=None,
                 help="report when each run's eval/success first reached this and its lowest eval after")
  p.add_argument("--root", required=True, help="one workdir per run goes under here")
  p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  p.add_argument("--parallel", type=int, default=1,
                 help="runs at once (default 1; keep 1 on a TPU host, where one process owns the chips)")
  p.add_argument("--python", default=sys.executable, help="interpreter for the runs")
  p.add_argument("--in_process", action="store_true",
                 help="run the runs one after another in this process (mtrl_jax/inprocess.py): runs of "
                      "equal shapes compile once instead of once each; needs --parallel 1")
  a, rest = p.parse_known_args(argv)
  if bad := [r for r in rest if not r.startswith("--config.")]:
    p.error(f"unrecognized arguments: {' '.join(bad)} (only --config.FIELD=VALUE is passed on to runs)")
  if a.parallel < 1:
    p.error("--parallel must be >= 1")
  if a.in_process and a.parallel != 1:
    p.error("--in_process runs one run at a time in this process: drop --parallel (or use processes)")
  if a.seeds < 0:
    p.error("--seeds must be >= 0")
  if a.seeds:
    if "seed=" in a.grid:
      p.error("--seeds and a seed=... key in --grid: choose one")
    a.grid = ";".join(x for x in (a.grid, "seed=" + ",".join(str(i) for i in range(a.seeds))) if x)
  if not a.grid:
    p.error("give --grid, --seeds or both")
  a.root = os.path.abspath(a.root)  # runs start in the repo root, not here
  path, sep, fixed = a.config.partition(":")
  if not os.path.exists(os.path.join(REPO, path)) and os.path.exists(path):
    a.config = os.path.abspath(path) + sep + fixed
  try:
    runs = expand(a.config, a.grid)
  except ValueError as e:
    p.error(str(e))

  todo = []
  for name, config in runs:
    workdir = os.path.join(a.root, name)
    cmd = command(a.python, config, workdir, rest)
    if is_done(workdir):
      print(f"# skip (final eval present): {name}")
    elif a.dry_run:
      print(shlex.join(cmd))
    else:
      todo.append((name, cmd, workdir))
  if a.dry_run:
    print(f"# {len(runs)} runs; cwd {REPO}")
    return 0

  how = "in this process" if a.in_process else f"parallel={a.parallel}"
  print(f"sweep: {len(todo)} to run, {len(runs) - len(todo)} done, {how}, root={a.root}", flush=True)
  failed = []
  for name, rc, secs in run_jobs(todo, a.parallel, a.in_process):
    status = "ok" if rc == 0 else f"FAILED rc={rc}"
    print(f"[{secs:7.1f}s] {status}: {name}  (log: {os.path.join(a.root, name, 'log.txt')})", flush=True)
    if rc != 0:
      failed.append(name)
  rep = seed_report([(name, os.path.join(a.root, name)) for name, _ in runs], a.bar)
  rep["failed"] = len(failed)
  print_seed_report(rep)
  if failed:
    print(f"sweep: {len(failed)} failed: {', '.join(sorted(failed))}; relaunch to retry them", file=sys.stderr)
  else:
    print(f"sweep: done; python -m experiments.summarize --root {a.root}")
  print(json.dumps(rep))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
