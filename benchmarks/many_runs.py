"""N main-job runs in one process vs N processes: wall time and programs compiled.

  python benchmarks/many_runs.py [--n 4] [--full]

The runs are configs/default.py at seeds 0..N-1 (equal shapes, as the seeds of
one study arm), at a small size by default (1-layer d=32 model, 2 SFT steps,
1 RL update, no final 64-task eval; --full: the runlocal smoke size with every
stage). Three ways to run them, each from a fresh process and fresh workdirs:

  processes       N x `python -m mtrl_jax.main`, no persistent compilation cache
  processes+cache the same sharing JAX's persistent cache (what study.py and
                  sweep.py did): the first compiles, the others load
  one process     mtrl_jax/inprocess.py: N runs one after another in one
                  process, no persistent cache; runs after the first reuse the
                  first's jitted programs (mtrl_jax/compile/programs.py)

Prints a table and one JSON line. Every run's summary numbers (eval success,
return) are compared across the three ways: they must be equal.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--config.model.n_layers=1", "--config.model.dim=32", "--config.model.mlp_dim=64",
         "--config.model.head_dim=8", "--config.demos.episodes=16", "--config.rollout.context_cap=192",
         "--config.sft.steps=2", "--config.rl.steps=1", "--config.eval.tasks=2", "--config.eval.greedy=False",
         "--config.rl.group_size=2", "--config.stages=('demos','sft','rl')"]
# What must not differ between the ways of running (times and compile counts may).
COMPARED = ("eval/success", "eval/return", "eval/turns", "eval/tokens_per_session")


def run_argvs(n: int, root: str, full: bool) -> list[list[str]]:
  extra = [] if full else SMALL
  return [[f"--config=configs/default.py:runlocal=true,seed={i}", *extra, f"--workdir={os.path.join(root, f'run{i}')}"]
          for i in range(n)]


def _env(cache: str) -> dict:
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # one device, as a laptop main job runs
  env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", MTRL_COMPILE_CACHE=cache)
  return env


def _summary(stdout: str) -> dict:
  for line in reversed(stdout.strip().splitlines()):
    if line.startswith("{"):
      return json.loads(line)
  raise RuntimeError(f"no summary line in the run's output:\n{stdout[-2000:]}")


def processes(argvs: list[list[str]], cache: str) -> tuple[float, list[dict]]:
  t0, out = time.time(), []
  for argv in argvs:
    p = subprocess.run([sys.executable, "-m", "mtrl_jax.main", *argv], cwd=REPO, env=_env(cache),
                       capture_output=True, text=True)
    if p.returncode:
      raise RuntimeError(f"run failed (rc {p.returncode}): {p.stderr[-3000:]}")
    out.append(_summary(p.stdout))
  return time.time() - t0, out


def one_process(argvs: list[list[str]]) -> tuple[float, list[dict]]:
  t0 = time.time()
  p = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", json.dumps(argvs)], cwd=REPO,
                     env=_env(""), capture_output=True, text=True)
  if p.returncode:
    raise RuntimeError(f"in-process runs failed (rc {p.returncode}): {p.stderr[-3000:]}")
  return time.time() - t0, json.loads(p.stdout.strip().splitlines()[-1])


def _child(argvs: list[list[str]]) -> None:
  """The N runs in this process; prints their summaries (each with its own compile counts)."""
  from mtrl_jax.inprocess import run_argv
  out = []
  for argv in argvs:
    rc, _ = run_argv(argv, log_path=os.path.join(argv[-1].split("=", 1)[1], "log.txt"))
    if rc:
      raise SystemExit(f"run failed (rc {rc}): see its log.txt")
    with open(os.path.join(argv[-1].split("=", 1)[1], "log.txt")) as f:
      out.append(_summary(f.read()))
  print(json.dumps(out))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--n", type=int, default=4)
  p.add_argument("--full", action="store_true", help="the runlocal smoke size, every stage")
  p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a._child:
    _child(json.loads(a._child))
    return 0
  rows = {}
  with tempfile.TemporaryDirectory() as tmp:
    rows["processes"] = processes(run_argvs(a.n, os.path.join(tmp, "p"), a.full), "")
    rows["processes+cache"] = processes(run_argvs(a.n, os.path.join(tmp, "c"), a.full), os.path.join(tmp, "cache"))
    rows["one process"] = one_process(run_argvs(a.n, os.path.join(tmp, "o"), a.full))
  ref = [{k: s.get(k) for k in COMPARED} for s in rows["processes"][1]]
  same = all([{k: s.get(k) for k in COMPARED} for s in sums] == ref for _, sums in rows.values())
  print(f"{a.n} runs of configs/default.py ({'runlocal' if a.full else 'small'}), seeds 0..{a.n - 1}")
  print("| how | wall s | per run s | compiled per run | from cache per run |")
  print("|---|---|---|---|---|")
  result = {"bench": "many_runs", "n": a.n, "size": "runlocal" if a.full else "small", "same_results": same}
  for name, (wall, sums) in rows.items():
    compiled = [int(s.get("compile/compiled", -1)) for s in sums]
    hits = [int(s.get("compile/cache_hits", -1)) for s in sums]
    print(f"| {name} | {wall:.1f} | {wall / a.n:.1f} | {compiled} | {hits} |")
    result[name.replace(" ", "_").replace("+", "_")] = {"wall_s": round(wall, 1), "compiled": compiled,
                                                         "cache_hits": hits}
  print(f"same eval numbers in all three: {same}")
  print(json.dumps(result))
  return 0 if same else 1


if __name__ == "__main__":
  sys.exit(main())
