"""The study's per-run records: one small JSON file per run under docs/study/, all the report reads.

  python -m experiments.study.records --root ROOT [--out docs/study]  # records of every finished run in ROOT
  python -m experiments.study.records --ceilings                      # every probe's ceiling (no run needed)
  python -m experiments.study.records --ceilings --round 3            # round 3's, per seed, into docs/study3

The study's runner (runner.py) writes a run's record when the run finishes (and a warm
start's, a critic warm start's); this command writes them for a root run
before that, or again. Layout under OUT:

  runs/<cell name>/seed=<s>.json     kind "run"
  critics/<warm start>,seed=<s>.json kind "critic" (value pretraining's final readout)
  warm/<warm start>.json             kind "warm" (the probe table's behaviour-cloning eval)
  ceilings/<warm start>.json         kind "ceiling" (the expert policy's success on the eval tasks; round 3's
                                     per seed, its draws being the seed's)

A run record (schema 1) holds the cell's configs/study.py arguments, the
config values the study varies or reports, the code the run was made with
(`provenance`: the commit, "unknown" outside git; `dirty`, whether mtrl_jax/ or
configs/ on disk differed from it; `tree`, their git tree hashes as on disk; the
last two absent from records written before they existed), every
eval (step, tokens seen, tasks, sampled success / return), the rollout curve
(step, tokens, success) and its token-weighted AUC, the critic's explained
variance and the oracle's during RL (means over updates), the share of
invalid actions per update (max, mean), the mean staleness, the wall time and
the machine (`machine`: the runner's wall.json; absent from records written
before it existed). A warm record also keeps `sft_loss`, the last logged
behaviour-cloning loss: the fingerprint starts.py compares a rebuilt warm start by.
"""
from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import subprocess
import tempfile

import numpy as np

from experiments.plot import rl_curves
from experiments.study import stats
from experiments.study.plan import PROBES, SEEDS, cell_name, warm_name
from mtrl_jax.metrics import read_metrics

SCHEMA = 1
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(REPO, "docs", "study")
SMOL_RECORDS = os.path.join(REPO, "docs", "study_smol")  # the real model's study: the byte report never reads them
ROUND3_RECORDS = os.path.join(REPO, "docs", "study3")  # the third round's (round3.py): the round-2 report never reads them
# The config values a record keeps (dotted paths into config.json).
CONFIG_KEYS = ("seed", "env.name", "env.kwargs", "rl.estimator", "rl.estimator_kwargs", "rl.steps",
               "rl.epochs", "rl.minibatches", "rl.whiten_advantages", "rl.kl_coef", "rl.tasks_per_update",
               "rl.group_size", "rl.lr", "rl.layout", "rl.context", "rl.decoupled",
               "rl.shuffle_advantages", "rl.shuffle_scope", "rl.shuffle_fraction", "critic.kind",
               "value_pretrain.enabled", "value_pretrain.stop_at_ratio", "eval.tasks", "eval.every", "eval.seed_offset", "sft.steps", "asynchronous.enabled", "asynchronous.eta")


# The folders whose content makes a run's numbers: the package and the configs (the study's own code,
# experiments/, only launches runs and reads their metrics).
CODE_DIRS = ("mtrl_jax", "configs")


def _git(repo: str, *args: str, env: dict | None = None) -> str:
  return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                        env=env).stdout.strip()


def provenance(repo: str = REPO) -> dict:
  """The code a record is made with: {"commit": HEAD or "unknown", "dirty": bool or None, "tree": {dir:
  git tree hash} or None}.

  `tree` is each of CODE_DIRS as it is on disk, tracked and untracked files alike (what a run imports;
  .gitignore'd files left out), hashed by git through a scratch index, so equal trees mean equal code
  whatever commit it sat on. `dirty`: some tree differs from HEAD's (edits not committed); other folders
  (docs/study/, where records land while a study runs) do not count. Outside git: "unknown", None, None.
  """
  try:
    sha = _git(repo, "rev-parse", "HEAD")
  except (OSError, subprocess.CalledProcessError):
    return {"commit": "unknown", "dirty": None, "tree": None}
  try:
    with tempfile.TemporaryDirectory() as tmp:
      env = {**os.environ, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
      _git(repo, "read-tree", "HEAD", env=env)
      _git(repo, "add", "-A", "--", *CODE_DIRS, env=env)
      tree = {d: _git(repo, "write-tree", f"--prefix={d}/", env=env) for d in CODE_DIRS}
    head = {d: _git(repo, "rev-parse", f"HEAD:{d}") for d in CODE_DIRS}
  except (OSError, subprocess.CalledProcessError):  # a folder missing from the index or from HEAD
    return {"commit": sha, "dirty": None, "tree": None}
  return {"commit": sha, "dirty": tree != head, "tree": tree}


# The vector extensions XLA's CPU code generator may pick between (what a record's `machine.isa` lists).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile")


@functools.cache  # read once a process: the runner writes it after every job
def machine() -> dict:
  """The machine a job runs on, as far as it shapes the numbers: the CPU's model name (XLA's CPU code and its
  summation order follow the processor: the round-3 starts rebuilt on an Intel Xeon differed from the AMD
  EPYC's records, docs/STUDY_ROUND3.md), its cores, and the jax/jaxlib versions. The runner writes it beside
  each finished job's wall time (wall.json); a record written before it existed has none."""
  import platform
  info: dict = {}
  try:  # the first processor's fields (a VM may name its CPU only "Intel(R) Xeon(R) Processor": keep its model)
    with open("/proc/cpuinfo") as f:
      for ln in f:
        if not ln.strip():
          break
        k, _, v = ln.partition(":")
        info.setdefault(k.strip(), v.strip())
  except OSError:
    pass
  flags = set(info.get("flags", "").split())
  out = {"cpu": info.get("model name") or platform.processor() or platform.machine(),
         "vendor": info.get("vendor_id"), "family_model": f"{info.get('cpu family')}/{info.get('model')}"
         if info else None, "isa": [x for x in ISA_FLAGS if x in flags], "cores": os.cpu_count()}
  try:
    import jax
    import jaxlib
    out.update(jax=jax.__version__, jaxlib=jaxlib.__version__)
  except ImportError:
    pass
  return out


def _wall(workdir: str) -> dict:
  """The runner's wall.json of a finished job: {"wall_s": ..., "machine": ...} (either may be absent)."""
  w = _json(os.path.join(workdir, "wall.json")) or {}
  return {"wall_s": w.get("wall_s"), "machine": w.get("machine")}


def _json(path: str) -> dict | None:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError):
    return None


def _pick(cfg: dict | None) -> dict:
  out = {}
  for key in CONFIG_KEYS:
    node = cfg
    for part in key.split("."):
      node = node.get(part) if isinstance(node, dict) else None
    if node is not None:
      out[key] = node
  return out


def _f(x):
  return None if x is None else float(x)


def run_record(workdir: str, cell: str, seed: int, args: dict, prov: dict | None = None) -> dict | None:
  """A finished run's record (None without a final `eval` line: unfinished or absent)."""
  recs = read_metrics(workdir)
  finals = [r for r in recs if r.get("stage") == "eval" and r.get("eval/success") is not None]
  if not finals:
    return None
  c = rl_curves(recs)  # drops the steps a resumed run rewrote
  steps, tokens, succ = c.get("rollout/success", ([], [], []))
  rl = [r for r in recs if r.get("stage") == "rl"]
  by_step = {int(r["step"]): r for r in rl}  # the last line of a step wins (a resumed run rewrites)
  tok = dict(zip(c.get("step", []), c.get("tokens", [])))
  cfg = _json(os.path.join(workdir, "config.json"))
  tasks = ((cfg or {}).get("eval") or {}).get("tasks")
  evals = [{"step": s, "tokens": tok.get(s), "tasks": tasks, "success": _f(r["eval/success"]),
            "return": _f(r.get("eval/return"))}
           for s, r in sorted(by_step.items()) if r.get("eval/success") is not None]
  final = finals[-1]
  evals.append({"step": "final", "tokens": tokens[-1] if tokens else None,
                "tasks": max(tasks or 0, 64) or None, "success": _f(final["eval/success"]),
                "return": _f(final.get("eval/return"))})
  turns = [r for r in by_step.values() if r.get("ledger/turns")]
  invalid = [r.get("ledger/invalid_actions", 0.0) / r["ledger/turns"] for r in turns]
  critic = {k: float(np.mean(v)) for k in ("explained_variance", "oracle_explained_variance")
            if (v := [r[f"value/{k}"] for r in by_step.values() if r.get(f"value/{k}") is not None])}
  stale = [r["staleness/mean"] for r in by_step.values() if r.get("staleness/mean") is not None]
  return {"schema": SCHEMA, "kind": "run", "cell": cell, "seed": int(seed), "args": args,
          "config": _pick(cfg), **(prov or provenance()), "evals": evals,
          "final": {"success": _f(final["eval/success"]), "return": _f(final.get("eval/return"))},
          "rollout": {"step": list(steps), "tokens": [float(t) for t in tokens], "success": [float(y) for y in succ]},
          "auc": stats.auc(tokens, succ),
          "critic": critic,
          "invalid_share": {"max": max(invalid), "mean": float(np.mean(invalid))} if invalid else None,
          "staleness": float(np.mean(stale)) if stale else None, **_wall(workdir)}


def critic_record(workdir: str, name: str, prov: dict | None = None) -> dict | None:
  """A critic warm start's final readout (value pretraining's last, held-out batch), or None."""
  final = [r for r in read_metrics(workdir) if r.get("value_pretrain/final")]
  if not final:
    return None
  r = final[-1]
  # The 95% session-bootstrap ends (train/critic_readout.py) and the sessions they were read on;
  # None in a record of a run that predates them.
  ends = [f"{k}_{e}" for k in ("explained_variance", "oracle_explained_variance", "ev_over_oracle")
          for e in ("lo", "hi")]
  out = {k: r.get(f"value_pretrain/{k}") for k in ("explained_variance", "oracle_explained_variance", "r2",
                                                    "decision_gap", "oracle_decision_gap", "critic_steps",
                                                    *ends, "readout_sessions")}
  warm, _, seed = name.rpartition(",critic,seed=")
  return {"schema": SCHEMA, "kind": "critic", "warm": warm, "seed": int(seed), **(prov or provenance()),
          "readout": out, **stop_of(r), **_wall(workdir)}


def stop_of(final: dict) -> dict:
  """How value pretraining ended, from its final metrics line: why it stopped (bar, ratio, plateau, steps,
  seconds), after how many rounds, and how many readouts of `readout_tasks` tasks it played (the final one
  and any that did not confirm the bar; a stage from before the confirmation existed played exactly one and
  logged no count)."""
  why = [k.rsplit("stopped_at_", 1)[1] for k, x in final.items() if "/stopped_at_" in k and x]
  rounds = final.get("value_pretrain/rounds")
  return {"stopped": why[0] if why else None, "rounds": None if rounds is None else int(rounds),
          "readouts": int(final.get("value_pretrain/readouts", 1))}


CEILING_TASKS = 256  # the RL cells' eval tasks (configs/study.py): the ceiling is measured on the same ones


def ceiling(env_name: str, kwargs: dict, seeds) -> float | None:
  """The probe's ceiling: the share of these tasks the env's expert policy succeeds on (None when the
  env cannot be built here, e.g. TextArena not installed). Task j is played as the eval plays it, as
  session j (train/evaluate.py: group id j, one session a group): an env with per-session draws
  (delayed, revisit) then draws the eval's own noise, reproducibly (without a session id it draws
  from the system's entropy: the committed ceilings made before this read a different sample)."""
  from mtrl_jax.envs import registry
  try:
    env = registry.make(env_name, **kwargs)
  except Exception:  # noqa: BLE001 (an optional dependency missing: no ceiling, not a failed record)
    return None
  wins = 0
  for j, seed in enumerate(seeds):
    env.reset(seed, j)
    while True:
      step = env.step(env.expert_action())
      if step.terminated or step.truncated:
        wins += bool(step.info.get("success"))
        break
  return wins / len(seeds)


def decision_shares(line: dict) -> dict:
  """The eval's turn-0 decision shares in a metrics line (train/evaluate.py's decision_shares), sampled and
  greedy: {"decision_cued", "decision_uncued", "greedy_decision_cued", ...}; {} for an env without a cue.

  The eval writes a decision's share only when some session took it; with a cue every session is cued or
  uncued (envs/delayed.py: a reply that is not an arm plays the uncued one), so where one is written the
  other's absence means 0 (a warm start that never follows the sign has no `eval/decision_cued`)."""
  out = {}
  for pre in ("", "greedy_"):
    got = {d: line.get(f"eval/{pre}decision_{d}") for d in ("cued", "uncued")}
    if any(v is not None for v in got.values()):
      out.update({f"{pre}decision_{d}": 0.0 if v is None else float(v) for d, v in got.items()})
  return out


def warm_record(workdir: str, name: str, prov: dict | None = None) -> dict | None:
  """A warm start's behaviour-cloning eval (the probe table) and the probe's ceiling, or None when unfinished.

  With a cue (round 3's delayed) it also keeps how often the eval's turn-0 arm follows the sign, sampled and
  greedy (`decision_shares`). Its `ceiling` is read with the warm start's own env (draw_seed 0, no format
  penalty); round 3's table reads the ceiling records instead (ceiling_record: the RL cells' env per seed)."""
  sft = [r for r in read_metrics(workdir) if r.get("stage") == "sft" and r.get("eval/success") is not None]
  if not sft:
    return None
  cfg = _json(os.path.join(workdir, "config.json")) or {}
  env, off = cfg.get("env") or {}, (cfg.get("eval") or {}).get("seed_offset")
  top = (ceiling(env["name"], dict(env.get("kwargs") or {}), range(off, off + CEILING_TASKS))
         if env.get("name") and off is not None else None)
  return {"schema": SCHEMA, "kind": "warm", "warm": name, **(prov or provenance()),
          "sft_steps": (cfg.get("sft") or {}).get("steps"), "success": _f(sft[-1]["eval/success"]),
          "greedy_success": _f(sft[-1].get("eval/greedy_success")), **decision_shares(sft[-1]), "ceiling": top,
          "ceiling_tasks": CEILING_TASKS if top is not None else None, "sft_loss": sft_loss(workdir),
          **_wall(workdir)}


def sft_loss(workdir: str) -> float | None:
  """The behaviour-cloning loss of the warm start's last logged step, to the last digit: a fingerprint of its
  parameters finer than its evals (two warm starts whose evals agree on 64 tasks can still differ; starts.py)."""
  loss = [r["sft/loss"] for r in read_metrics(workdir) if r.get("stage") == "sft" and r.get("sft/loss") is not None]
  return float(loss[-1]) if loss else None


def ceiling_record(probe: str, horizon: int, prov: dict | None = None, args: dict | None = None,
                   seeds=SEEDS) -> dict:
  """The probe's ceiling on the RL cells' eval tasks, from its configs/study.py RL config (no run needed).

  `args`: the RL cells' other arguments that shape the env (round 3's round3.base: cue=true, draws=true); the
  record is then named for their warm start (plan.warm_name, as its warm record is) and read per seed: with
  draws the eval's hidden draws are the run's seed's (draw_seed = seed), so the expert plays each of `seeds`
  on its own cells' env: "per_seed" (in the order of "seeds") and their mean, "ceiling". Without `args`: the
  second round's record, as it always was (one config, seed 0)."""
  from configs.study import get_config
  if not args:
    c = get_config(f"probe={probe},horizon={horizon}")
    off = int(c.eval.seed_offset)
    top = ceiling(c.env.name, c.env.kwargs.to_dict(), range(off, off + int(c.eval.tasks)))
    return {"schema": SCHEMA, "kind": "ceiling", "warm": f"probe={probe},horizon={horizon}",
            **(prov or provenance()), "ceiling": top, "tasks": int(c.eval.tasks), "seed_offset": off}
  cell = cell_name({"probe": probe, "horizon": horizon, **args})  # the arm is any: the env is every arm's
  configs = [get_config(f"{cell},seed={s}") for s in seeds]
  (off, tasks), = {(int(c.eval.seed_offset), int(c.eval.tasks)) for c in configs}  # one task set for all seeds
  per_seed = [ceiling(c.env.name, c.env.kwargs.to_dict(), range(off, off + tasks)) for c in configs]
  top = None if None in per_seed else float(np.mean(per_seed))
  return {"schema": SCHEMA, "kind": "ceiling", "warm": warm_name(probe, horizon, cue=bool(args.get("cue"))),
          **(prov or provenance()), "ceiling": top, "tasks": tasks, "seed_offset": off, "args": dict(args),
          "seeds": [int(s) for s in seeds], "per_seed": per_seed}


def round3_ceilings(out: str, warms=None, prov: dict | None = None, missing_only: bool = False) -> list[str]:
  """Writes the ceiling record of each of round 3's probes (round3.probes; `warms`: only these warm starts)
  under `out` over the plan's seeds; `missing_only`: not where one is already written. Returns the paths."""
  from experiments.study import round3
  seeds = sorted({s for e in round3.EXPERIMENTS for s in e.seeds})
  todo = {w: env for w, env in round3.probes().items() if (warms is None or w in warms)
          and not (missing_only and os.path.exists(os.path.join(out, "ceilings", f"{w}.json")))}
  prov = prov or (provenance() if todo else None)
  return [write(out, ceiling_record(env["probe"], env["horizon"], prov,
                                    {k: v for k, v in env.items() if k not in ("probe", "horizon")}, seeds))
          for env in todo.values()]


def path_of(out: str, rec: dict) -> str:
  if rec["kind"] == "ceiling":
    return os.path.join(out, "ceilings", f"{rec['warm']}.json")
  if rec["kind"] == "run":
    return os.path.join(out, "runs", rec["cell"], f"seed={rec['seed']}.json")
  if rec["kind"] == "critic":
    return os.path.join(out, "critics", f"{rec['warm']},seed={rec['seed']}.json")
  return os.path.join(out, "warm", f"{rec['warm']}.json")


def write(out: str, rec: dict) -> str:
  path = path_of(out, rec)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(rec, f, indent=1, sort_keys=True)
    f.write("\n")
  return path


def load(out: str) -> dict:
  """{"runs": {(cell, seed): rec}, "critics": {(warm, seed): rec}, "warm": {warm: rec}, "ceilings": {warm: rec}}
  from OUT."""
  got = {"runs": {}, "critics": {}, "warm": {}, "ceilings": {}}
  paths = [p for kind in ("runs", "critics", "warm", "ceilings") for p in glob.glob(os.path.join(out, kind, "**", "*.json"),
                                                                         recursive=True)]
  for path in sorted(paths):
    rec = _json(path)
    if not rec or rec.get("schema") != SCHEMA:
      continue
    if rec["kind"] == "run":
      got["runs"][(rec["cell"], rec["seed"])] = rec
    elif rec["kind"] == "critic":
      got["critics"][(rec["warm"], rec["seed"])] = rec
    elif rec["kind"] == "warm":
      got["warm"][rec["warm"]] = rec
    elif rec["kind"] == "ceiling":
      got["ceilings"][rec["warm"]] = rec
  return got


def export(root: str, out: str = DEFAULT_OUT, cells: dict | None = None) -> dict:
  """Records of every finished run, critic warm start and warm start under ROOT (the study's layout).

  `cells`: run folder name -> the cell's full configs/study.py arguments (study.planned_runs); runs
  not in it are recorded with the arguments read back from their folder name."""
  prov = provenance()
  n = {"runs": 0, "critics": 0, "warm": 0}
  for d in sorted(glob.glob(os.path.join(root, "runs", "*,seed=*"))):
    name = os.path.basename(d)
    cell, _, seed = name.rpartition(",seed=")
    args = (cells or {}).get(name) or dict(kv.split("=", 1) for kv in cell.split(","))
    if rec := run_record(d, cell, int(seed), args, prov):
      write(out, rec)
      n["runs"] += 1
  for d in sorted(glob.glob(os.path.join(root, "warm", "*"))):
    name = os.path.basename(d)
    rec = critic_record(d, name, prov) if ",critic,seed=" in name else warm_record(d, name, prov)
    if rec:
      write(out, rec)
      n["critics" if rec["kind"] == "critic" else "warm"] += 1
  return n


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(prog="python -m experiments.study.records", description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="", help="a study root (python -m experiments.study --root)")
  p.add_argument("--out", default=None, help=f"default {os.path.relpath(DEFAULT_OUT, REPO)}; with --round 3 "
                                                f"{os.path.relpath(ROUND3_RECORDS, REPO)}")
  p.add_argument("--ceilings", action="store_true", help="(no --root needed) write every probe's ceiling record")
  p.add_argument("--round", type=int, choices=(2, 3), default=2,
                 help="--ceilings: 3 writes round 3's (round3.probes: the RL cells' env, per seed)")
  a = p.parse_args(argv)
  if a.out is None:
    a.out = ROUND3_RECORDS if a.round == 3 else DEFAULT_OUT
  if a.ceilings and a.round == 3:
    n = {"ceilings": round3_ceilings(a.out)}
    print(json.dumps(n))
    return n
  if a.ceilings:
    prov = provenance()
    n = {"ceilings": [write(a.out, ceiling_record(pr, h, prov)) for pr, h in PROBES]}
    print(json.dumps(n))
    return n
  if not a.root or not os.path.isdir(a.root):
    p.error(f"--root {a.root} is not a folder (the study's run folders are not in the repo; its records are)")
  n = export(a.root, a.out)
  print(json.dumps(n))
  return n


if __name__ == "__main__":
  main()
