"""The study's runner: every warm start, critic warm start and run of the plan, resumable.

  python -m experiments.study --root /tmp/study --parallel 2 --probes --lab  # everything, resumable
  python -m experiments.study --root /tmp/study --only E2 --dry_run  # the commands of one experiment
  python -m experiments.study.report                                 # docs/study/ -> docs/STUDY.md + figures

A run is one cell of the plan (plan.py) at one seed, in the folder
ROOT/runs/<cell name>,seed=<s>; a cell used by several experiments is run
once. Every RL run of a probe starts from that probe's warm start,
ROOT/warm/<probe>,horizon=<h> (built first, once); critic arms with value
pretraining on start from the probe's critic warm start,
ROOT/warm/<probe>,horizon=<h>,critic,seed=<s> (the policy warm start plus a
critic pretrained on it: Monte-Carlo targets, train/value_pretrain.py; built
after the policy warm starts, before the runs; its metrics hold the critic
readout the report puts beside every critic result). A relaunch of the same
command skips finished jobs (a final `eval` line in metrics.jsonl) and resumes
the others from their checkpoints. Every finished run, warm start and critic
warm start leaves a small record in the repo, docs/study/{runs,warm,critics}/
(records.py; `--records` moves or turns them off): the report reads only those.

A run that already has its record there is skipped (`--rerun` runs it again and overwrites the record, so
`git diff` shows what did not reproduce). Before any run, every warm start and critic warm start the runs
begin from, built now or found done in ROOT, is compared with its record (starts.py): a start rebuilt on
another CPU kind can be another start, and then none of the runs that begin from it, or from the policy warm
start under it, is launched; the record is kept, the rebuilt one goes to ROOT/start_mismatch/, and the
command exits 1 after running the rest.

The jobs run through experiments/sweep.py's `run_jobs` (processes, or one
after another in this process with `--in_process`). The probe table
(`--probes`) builds the warm start of every probe task and reports how often
it succeeds: how much the study leaves RL to fix.

The same study on the real model (issue 32 item 8): `--model smol` runs SMOL_EXPERIMENTS (E1's claim
cells and positive control at horizons 2 and 8, 2 seeds) with SmolLM2-135M-Instruct as the policy
(configs/study.py:model=smol), sized for <= 9 minutes on one H100/H200 with `--parallel 8` (the
estimate: plan.py's SMOL_HORIZONS). Its runs, warm starts, critic warm starts and records carry
`model=smol` at the head of their names, and its records go to docs/study_smol/ by default:

  python -m experiments.study --model smol --root /tmp/smol_study --parallel 8 [--hf_dir DIR]
  python -m experiments.study --model smol --root /tmp/s --runlocal --hf_dir CUT  # CPU smoke size

The third round (issue 41; round3.py, pre-registered): `--round 3` runs its plan the same way (policy warm
starts of delayed(cue) per horizon, a full and a partial critic warm start each, then the runs), with
records in docs/study3/ by default (and, first, the ceiling record of each probe it runs, if absent):

  python -m experiments.study --round 3 --root /tmp/study3 --dry_run     # its jobs, listed

Amendment 1 (docs/STUDY_ROUND3.md; kinds.py): a second machine kind adds whole seed blocks (one horizon at one
seed) from its own starts, recorded in its own folder (round3.MACHINE_KINDS), e.g. on the Intel Xeon:

  python -m experiments.study --round 3 --root /tmp/study3 --parallel 2 --horizons 2 --seeds 5-7 --records docs/study3_xeon

A block that another kind's folder already has runs of is not launched (the runner says which and whose).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from experiments.study import kinds
from experiments.study import records
from experiments.study import round3
from experiments.study import starts
from experiments.study.plan import (CONFIG, LAB_HORIZON, LAB_PROBES, PROBES, Cell, critic_warm, experiment,
                                    plan, planned_runs, policy_warm, warm_name)
from experiments.sweep import REPO, command, is_done, run_jobs
from mtrl_jax.compile import cache as compile_cache
from mtrl_jax.metrics import read_metrics


def warm_command(python: str, root: str, warm: str) -> tuple[list[str], str]:
  workdir = os.path.join(root, "warm", warm)
  return command(python, f"{CONFIG}:{warm},stage=warm", workdir, []), workdir


def critic_command(python: str, root: str, name: str) -> tuple[list[str], str]:
  """Value pretraining of one probe's critic at one seed, from the probe's policy warm start."""
  head, _, seed = name.rpartition(",critic,seed=")  # head: the policy warm start's name (and vpr=, if partial)
  workdir = os.path.join(root, "warm", name)
  return command(python, f"{CONFIG}:{head},stage=critic,seed={seed}", workdir,
                 [f"--config.init_from={os.path.join(root, 'warm', policy_warm(name))}"]), workdir


def run_command(python: str, root: str, name: str, cell: Cell, extra: list[str]) -> tuple[list[str], str]:
  workdir = os.path.join(root, "runs", name)
  seed = int(name.rsplit("seed=", 1)[1])
  warm = os.path.join(root, "warm", critic_warm(cell, seed) or cell.warm)
  return command(python, f"{CONFIG}:{name}", workdir, [f"--config.init_from={warm}", *extra]), workdir


def lab_job(python: str, root: str, probe: str = "bifurcation",
            horizon: int = LAB_HORIZON) -> tuple[str, list[str], str]:
  """The credit-accuracy lab on the warm start of one of E1's long-horizon probes."""
  workdir = os.path.join(root, "lab", f"{probe}{horizon}")
  warm = os.path.join(root, "warm", warm_name(probe, horizon))
  hint = ",hint=false" if probe == "memory" else ""  # the lab's env must be the probe the warm start learned
  cmd = [python, "-m", "mtrl_jax.lab.credit_accuracy", f"--config=configs/lab.py:env={probe},length={horizon}{hint}",
         f"--workdir={workdir}", f"--config.init_from={warm}"]
  return f"lab {probe}{horizon}", cmd, workdir


def _pool(jobs, parallel: int, what: str, on_done=None, in_process: bool = False) -> list[str]:
  """Runs the jobs; `on_done(name, workdir)` after each one that finished (its record).
  `parallel` processes at once, or (`in_process`) the main-job runs one after another in this
  process: sweep.run_jobs, the one job runner of experiments/."""
  failed, done = [], 0
  workdirs = {name: workdir for name, _, workdir in jobs}
  t0 = time.time()
  for name, rc, secs in run_jobs(jobs, parallel, in_process):
    done += 1
    if rc == 0:  # the record's wall time (records.py reads it)
      with open(os.path.join(workdirs[name], "wall.json"), "w") as f:
        json.dump({"wall_s": secs, "machine": records.machine()}, f)
    status = "ok" if rc == 0 else f"FAILED rc={rc}"
    left = (time.time() - t0) / done * (len(jobs) - done)
    print(f"[{what} {done}/{len(jobs)} {secs:6.1f}s, ~{left / 60:.0f} min left] {status}: {name}", flush=True)
    if rc:
      failed.append(name)
    elif on_done:
      on_done(name, workdirs[name])
  return failed


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m experiments.study", description=__doc__.split("\n\n")[0],
                              epilog=__doc__.split("\n\n", 1)[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--root", required=True)
  p.add_argument("--only", default="", help="comma-separated experiment ids (default: all)")
  p.add_argument("--seeds", default=None,
                 help="N: seeds 0..N-1 per cell; A-B or A,B,...: those seeds (default: each experiment's own, 8)")
  p.add_argument("--probe", default="", help="run only the cells of this probe (e.g. delayed)")
  p.add_argument("--horizons", default="", help="comma-separated: run only the cells at these horizons (e.g. 8,2)")
  p.add_argument("--arms", default="", help="comma-separated: run only the cells of these arms (a cut of cells)")
  p.add_argument("--critic", choices=("any", "pretrained", "none"), default="any",
                 help="only the runs that start from a pretrained critic, or only those that do not: two "
                      "disjoint halves two processes can run at once (the second needs no critic warm start)")
  p.add_argument("--probes", action="store_true", help="also build the warm start of every probe task")
  p.add_argument("--lab", action="store_true",
                 help="also run the credit-accuracy lab on E1's long-horizon warm start (ROOT/lab/)")
  p.add_argument("--warm_only", action="store_true", help="build the warm starts, run nothing else")
  p.add_argument("--parallel", type=int, default=1, help="runs at once (CPU; keep 1 on a TPU host)")
  p.add_argument("--in_process", action="store_true",
                 help="the warm starts, critics and runs one after another in this process "
                      "(experiments/inprocess.py): runs of equal shapes compile once; needs --parallel 1")
  p.add_argument("--rerun", action="store_true",
                 help="also run the runs that already have a record in the records folder (they are skipped "
                      "by default: a fresh root would otherwise redo and overwrite them); their new records "
                      "overwrite the old, so `git diff` shows what did not reproduce")
  p.add_argument("--dry_run", action="store_true")
  p.add_argument("--python", default=sys.executable)
  p.add_argument("--records", default=None,
                 help="where each finished run, warm start and critic warm start writes its record "
                      "(default docs/study, what the report reads; docs/study_smol with --model smol; '' = none)")
  p.add_argument("--round", type=int, choices=(2, 3), default=2,
                 help="3: the third round's plan (round3.py: delayed(cue) at H 2, 8, 32, critic quality, graded "
                      "controls); its records go to docs/study3/ by default")
  p.add_argument("--model", choices=("byte", "smol"), default="byte",
                 help="smol: the real model's plan (SMOL_EXPERIMENTS, configs/study.py:model=smol)")
  p.add_argument("--hf_dir", default="", help="--model smol: the SmolLM2 folder (default configs/smol.py's)")
  p.add_argument("--runlocal", action="store_true",
                 help="every job at configs/study.py's smoke size (runlocal=true): a CPU check of the pipeline")
  a, rest = p.parse_known_args(argv)
  if a.in_process and a.parallel != 1:
    p.error("--in_process runs one job at a time in this process: drop --parallel (or use processes)")
  if bad := [r for r in rest if not r.startswith("--config.")]:
    p.error(f"unrecognized arguments: {' '.join(bad)} (only --config.FIELD=VALUE goes to the RL runs)")
  if a.hf_dir and (a.model != "smol" or "," in a.hf_dir):
    p.error(f"--hf_dir {a.hf_dir!r}: only with --model smol, and without a comma (it rides in the config's args)")
  if a.model == "smol" and a.lab:
    p.error("--lab runs on the byte model's warm starts; drop it with --model smol")
  if a.round == 3 and (a.model != "byte" or a.lab):
    p.error("--round 3 is planned on the byte model without the lab: drop --model smol / --lab")
  if a.records is None:
    a.records = (records.SMOL_RECORDS if a.model == "smol" else
                 records.ROUND3_RECORDS if a.round == 3 else records.DEFAULT_OUT)
  exps = round3.EXPERIMENTS if a.round == 3 else plan(a.model)
  ids = [x for x in a.only.split(",") if x]
  for eid in ids:
    round3.experiment(eid) if a.round == 3 else experiment(eid, a.model)
  root = os.path.abspath(a.root)
  try:
    horizons = tuple(int(h) for h in a.horizons.split(",") if h)
  except ValueError:
    p.error(f"--horizons {a.horizons!r}: comma-separated integers")
  try:
    seeds = None if a.seeds is None else parse_seeds(a.seeds)
  except ValueError as e:
    p.error(f"--seeds {a.seeds!r}: {e}")
  runs = planned_runs(ids, seeds, a.probe or None, horizons or None,
                      model=a.model, experiments=exps)
  if a.arms:
    keep = set(a.arms.split(","))
    arms = {c.full["arm"] for e in exps for c in e.cells}
    if bad := keep - arms:
      p.error(f"--arms: no cell has {sorted(bad)}; the cells' arms: {sorted(arms)}")
    runs = {n: c for n, c in runs.items() if c.full["arm"] in keep}
  if a.critic != "any":
    runs = {n: c for n, c in runs.items()
            if (critic_warm(c, int(n.rsplit("seed=", 1)[1])) is not None) == (a.critic == "pretrained")}
  warms = sorted({c.warm for c in runs.values()} | ({warm_name(*pr, a.model) for pr in PROBES} if a.probes else set()))
  warm_jobs = [(w, *warm_command(a.python, root, w)) for w in warms]
  critics = sorted({cw for n, c in runs.items() if (cw := critic_warm(c, int(n.rsplit("seed=", 1)[1])))})
  critic_jobs = [(w, *critic_command(a.python, root, w)) for w in critics]
  run_jobs = [(n, *run_command(a.python, root, n, c, rest)) for n, c in sorted(runs.items())]
  more = ",".join(([f"hf_dir={a.hf_dir}"] if a.hf_dir else []) + (["runlocal=true"] if a.runlocal else []))
  if more:
    warm_jobs, critic_jobs, run_jobs = (_with_args(j, more) for j in (warm_jobs, critic_jobs, run_jobs))
  if a.dry_run:
    for _, cmd, _ in warm_jobs + critic_jobs + run_jobs:
      print(" ".join(cmd))
    print(f"# {len(warm_jobs)} warm starts, {len(critic_jobs)} critic warm starts, {len(run_jobs)} runs; "
          f"cwd {REPO}")
    print(json.dumps({"dry_run": True, "warm_starts": len(warm_jobs), "critic_warm_starts": len(critic_jobs),
                      "runs": len(run_jobs)}))
    return 0
  if a.records and not a.rerun:  # a recorded run is done wherever it ran; its start need not be rebuilt
    recorded = {n for n in runs if os.path.exists(records.path_of(a.records, {
        "kind": "run", "cell": n.rpartition(",seed=")[0], "seed": int(n.rpartition(",seed=")[2])}))}
    if recorded:
      print(f"study: {len(recorded)} of {len(runs)} runs already recorded in {a.records}: skipped "
            "(--rerun runs them again)", flush=True)
      runs = {n: c for n, c in runs.items() if n not in recorded}
      run_jobs = [j for j in run_jobs if j[0] in runs]
      warm_jobs, critic_jobs, warms = _starts_of(runs, warm_jobs, critic_jobs, warms, a)
  if a.round == 3 and a.records and (taken := kinds.owned_elsewhere(runs, a.records)):
    # Amendment 1: a block (one horizon at one seed) is one machine kind's, from that kind's own starts.
    where = sorted({f"H={kinds.horizon_of(n.rpartition(',seed=')[0])} seed {n.rpartition(',seed=')[2]} "
                    f"({rel})" for n, rel in taken.items()})
    print(f"study: {len(taken)} runs not launched: their blocks belong to another machine kind: {', '.join(where)}",
          file=sys.stderr, flush=True)
    runs = {n: c for n, c in runs.items() if n not in taken}
    run_jobs = [j for j in run_jobs if j[0] in runs]
    warm_jobs, critic_jobs, warms = _starts_of(runs, warm_jobs, critic_jobs, warms, a)
  os.makedirs(root, exist_ok=True)
  if a.model == "smol":  # --parallel N processes share one GPU: none may take 75% of its memory up front
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  # JAX's persistent compilation cache, shared by the runs: every run compiles the same
  # functions (same shapes), so all but the first load them (measured on the 2-core CPU:
  # one bifurcation run 66 s without the cache, 23 s with it; identical results). The runs'
  # config.compile_cache "auto" points at ROOT/jax_cache (mtrl_jax/compile/cache.py);
  # --config.compile_cache=DIR (or '' for none) still wins.
  os.environ.setdefault(compile_cache.ENV, os.path.join(root, "jax_cache"))
  with open(os.path.join(root, "study.json"), "a") as f:
    f.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:] if argv is None
                        else list(argv), "runs": len(run_jobs), "warm": len(warm_jobs)}) + "\n")
  if a.round == 3 and a.records:  # the probe table's ceilings (the RL cells' env per seed): seconds, no run
    for path in records.round3_ceilings(a.records, warms, missing_only=True):
      print(f"study: ceiling record {path}", flush=True)
  warm_todo = [j for j in warm_jobs if not _warm_done(j[2])]
  print(f"study: {len(warm_todo)} of {len(warm_jobs)} warm starts to build, parallel={a.parallel}", flush=True)
  def record(name, workdir):  # the record of a finished job, in the repo (records.py)
    # A start's record is what the recorded runs started from: a rebuild never replaces it (starts.check
    # compares the two before any run).
    if a.records and (name in runs or starts.recorded(a.records, name) is None):
      write_record(a.records, runs, name, workdir)
    if a.model == "smol" and name in runs:
      # A finished run is done (its metrics say so, its record holds them) and nothing starts from it;
      # its SmolLM2 checkpoint (1.6-3.2 GB) would fill a GPU machine's disk over 16 runs.
      shutil.rmtree(os.path.join(workdir, "checkpoints"), ignore_errors=True)

  failed = _pool(warm_todo, a.parallel, "warm", record, in_process=a.in_process)
  if failed:
    print(f"study: warm starts failed: {failed}; relaunch to retry", file=sys.stderr)
    print(json.dumps({"warm_starts": len(warm_jobs), "warm_failed": failed}))
    return 1
  # A policy warm start that already differs from its record (its evals, its sft_loss where recorded) needs no
  # critic built on it: none of its runs will be launched (below).
  bad_warm = starts.check(a.records, root, [w for w, _, _ in warm_jobs]) if a.records else {}
  critic_todo = [j for j in critic_jobs if not _critic_done(j[2]) and policy_warm(j[0]) not in bad_warm]
  print(f"study: {len(critic_todo)} of {len(critic_jobs)} critic warm starts to build", flush=True)
  failed = _pool(critic_todo, a.parallel, "critic", record, in_process=a.in_process)
  if failed:
    print(f"study: critic warm starts failed: {failed}; relaunch to retry", file=sys.stderr)
    print(json.dumps({"warm_starts": len(warm_jobs), "critic_failed": failed}))
    return 1
  bad, refused = {}, []
  if a.records:  # every start the runs begin from, as built here, against its record (starts.py)
    names = [c for c, _, _ in critic_jobs if policy_warm(c) not in bad_warm]
    names += [n for n in _root_critics(root) if policy_warm(n) in warms and n not in names
              and policy_warm(n) not in bad_warm]
    bad = {**bad_warm, **starts.check(a.records, root, names)}
    if bad:
      refused = starts.refused(runs, bad)
      print(starts.message(bad, len(refused), root), file=sys.stderr, flush=True)
      run_jobs = [j for j in run_jobs if j[0] not in set(refused)]
  mismatch = {"start_mismatch": sorted(bad), "refused": len(refused)} if bad else {}
  if a.warm_only:
    print(json.dumps({"warm_starts": len(warm_jobs), "critic_warm_starts": len(critic_jobs), "warm_failed": [],
                      **mismatch}))
    return 1 if bad else 0
  todo = [j for j in run_jobs if not is_done(j[2])]
  if a.lab:
    for probe in LAB_PROBES:
      if a.probe and probe != a.probe:
        continue
      job = lab_job(a.python, root, probe)
      if not os.path.exists(os.path.join(job[2], "lab", "result.json")):  # the lab's last output
        todo.insert(0, job)  # first: the longest jobs, so the pool does not end on one
  print(f"study: {len(todo)} of {len(run_jobs)} runs to go, root={root}", flush=True)
  failed = _pool(todo, a.parallel, "run", record, in_process=a.in_process)
  summary = {"warm_starts": len(warm_jobs), "runs": len(run_jobs), "ran": len(todo), "failed": failed, **mismatch}
  if bad:
    print(f"study: {len(refused)} runs not launched: their starts differ from the records (above)", file=sys.stderr)
    print(json.dumps(summary))
    return 1
  if failed:
    print(f"study: {len(failed)} runs failed: {', '.join(failed)}; relaunch to retry", file=sys.stderr)
    print(json.dumps(summary))
    return 1
  print(f"study: done; python -m experiments.study.report --records {a.records or 'DIR'}")
  print(json.dumps(summary))
  return 0


def _starts_of(runs: dict, warm_jobs: list, critic_jobs: list, warms: list, a) -> tuple[list, list, list]:
  """The warm and critic jobs (and warm names) that the runs still to go begin from (a recorded or refused
  run needs no start rebuilt; --probes keeps every probe's warm start)."""
  keep = {c.warm for c in runs.values()} | ({warm_name(*pr, a.model) for pr in PROBES} if a.probes else set())
  keep |= {cw for n, c in runs.items() if (cw := critic_warm(c, int(n.rsplit("seed=", 1)[1])))}
  return ([j for j in warm_jobs if j[0] in keep], [j for j in critic_jobs if j[0] in keep],
          [w for w in warms if w in keep])


def parse_seeds(text: str) -> tuple[int, ...]:
  """'N' -> 0..N-1; 'A-B' -> A..B; 'A,B,...' -> those (each seed once, in order given)."""
  try:
    if "," in text:
      seeds = tuple(int(x) for x in text.split(",") if x)
    elif "-" in text:
      lo, hi = (int(x) for x in text.split("-"))
      seeds = tuple(range(lo, hi + 1))
    else:
      seeds = tuple(range(int(text)))
  except ValueError:
    raise ValueError("a count N, a range A-B or a list A,B,...") from None
  if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
    raise ValueError("no seed, a negative one or one twice")
  return seeds


def _with_args(jobs: list, more: str) -> list:
  """The jobs with `more` ("k=v,...") appended to their configs/study.py argument (the folders keep their
  names: --hf_dir and --runlocal change where the model comes from and the sizes, not the cell)."""
  head = f"--config={CONFIG}:"
  return [(n, [f"{x},{more}" if x.startswith(head) else x for x in cmd], w) for n, cmd, w in jobs]


def write_record(out: str, runs: dict, name: str, workdir: str) -> str | None:
  """The record of a finished job under `out` (a run of `runs`, a critic or a policy warm start); its
  path, or None when the job left nothing to record (no final eval)."""
  if name in runs:
    cell, _, seed = name.rpartition(",seed=")
    rec = records.run_record(workdir, cell, int(seed), runs[name].full)
  elif ",critic,seed=" in name:
    rec = records.critic_record(workdir, name)
  else:
    rec = records.warm_record(workdir, name)
  return records.write(out, rec) if rec else None


def _root_critics(root: str) -> list[str]:
  """The critic warm starts finished in ROOT (each one a fine-grained witness of the policy warm start under it)."""
  d = os.path.join(root, "warm")
  return sorted(n for n in (os.listdir(d) if os.path.isdir(d) else [])
                if ",critic,seed=" in n and _critic_done(os.path.join(d, n)))


def _critic_done(workdir: str) -> bool:
  """A critic warm start is done when value pretraining wrote its final readout."""
  return any(r.get("value_pretrain/final") for r in read_metrics(workdir))


def _warm_done(workdir: str) -> bool:
  """A warm start is done when its sft stage wrote its evaluation."""
  return any(r.get("stage") == "sft" and "eval/success" in r for r in read_metrics(workdir))

