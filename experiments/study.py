"""The credit-assignment study: its experiments as data, and the command that runs them.

  python experiments/study.py --root /tmp/study --parallel 2 --probes --lab  # everything, resumable
  python experiments/study.py --root /tmp/study --only E2 --dry_run  # the commands of one experiment
  python experiments/report.py                                       # docs/study/ -> docs/STUDY.md + figures

Each experiment names its question, the published claim and its source, its
cells (argument sets of configs/study.py) and the comparisons the claim makes
("cell A beats cell B"). A run is one cell at one seed, in the folder
ROOT/runs/<cell name>,seed=<s>; a cell used by several experiments (the
synchronous GRPO cell is E1's and E2's) is run once. Every RL run of a probe
starts from that probe's warm start, ROOT/warm/<probe>,horizon=<h> (built first,
once). A relaunch of the same command skips finished runs (a final `eval` line
in metrics.jsonl) and resumes the others from their checkpoints. Every finished
run, warm start and critic warm start leaves a small record in the repo,
docs/study/{runs,warm,critics}/ (experiments/records.py; `--records` moves or
turns them off): the report reads only those.

Every experiment carries a positive control: a pair whose difference must
exist if the design can see anything (the experiment's reference arm against
the same arm with its advantages shuffled within the batch). The report
judges the claims by paired per-seed differences (experiments/stats.py) and
calls an experiment whose control does not separate "underpowered".

The probe table (`--probes`) builds the warm start of every probe task and
reports how often it succeeds: how much the study leaves RL to fix.

Critic arms with value pretraining on start from a *critic warm start*,
ROOT/warm/<probe>,horizon=<h>,critic,seed=<s>: the probe's policy warm start
plus a critic pretrained on it (Monte-Carlo targets, train/value_pretrain.py).
Their critics are the same network fitted to the same targets of the same
policy, so one per probe and seed serves every such arm (built after the
policy warm starts, before the runs); its metrics hold the critic readout
the report puts beside every critic result.

The same study on the real model (issue 32 item 8): `--model smol` runs SMOL_EXPERIMENTS (E1's claim
cells and positive control at horizons 2 and 8, 2 seeds) with SmolLM2-135M-Instruct as the policy
(configs/study.py:model=smol), sized for <= 9 minutes on one H100/H200 with `--parallel 8` (the
estimate: SMOL_HORIZONS below). Its runs, warm starts, critic warm starts and records carry `model=smol`
at the head of their names, and its records go to docs/study_smol/ by default:

  python experiments/study.py --model smol --root /tmp/smol_study --parallel 8 [--hf_dir DIR]
  python experiments/study.py --model smol --root /tmp/s --runlocal --hf_dir CUT  # CPU smoke size
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep import REPO, command, is_done, run_job  # noqa: E402

from mtrl_jax.compile import cache as compile_cache  # noqa: E402
import records  # noqa: E402
from mtrl_jax.metrics import read_metrics  # noqa: E402

CONFIG = "configs/study.py"
SEEDS = tuple(range(8))
# configs/study.py's defaults for the keys a cell may set; a cell's name lists
# probe, horizon and arm always, the other keys only where they differ.
DEFAULTS = {"probe": "delayed", "horizon": 8, "arm": "grpo", "lp": -1.0, "lc": -1.0, "eta": 0,
            "decoupled": True, "vp": True, "context": "session", "shuffle": False}
ALWAYS = ("probe", "horizon", "arm")
# Every probe task with the horizon its warm start is measured at (the probe table). bifurcation and
# memory stay in the table only: common random numbers within a group make their horizon irrelevant to
# every group estimator (issue 32), so no experiment runs on them any more.
PROBES = (("delayed", 2), ("delayed", 8), ("delayed", 32), ("revisit", 4), ("revisit", 16),
          ("memory", 4), ("memory", 8), ("bifurcation", 2), ("bifurcation", 8), ("keydoor", 5),
          ("frozenlake", 0), ("sokoban", 0))


def _fmt(v) -> str:
  return str(v).lower() if isinstance(v, bool) else str(v)


def _model(name: str, model: str) -> str:
  """A name on the real model leads with `model=smol` (configs/study.py's argument): its folders and
  records never meet the byte model's; the byte model's names are as they always were."""
  return name if model == "byte" else f"model={model},{name}"


def cell_name(args: dict) -> str:
  full = {**DEFAULTS, **args}
  keys = [k for k in DEFAULTS if k in ALWAYS or full[k] != DEFAULTS[k]]
  return _model(",".join(f"{k}={_fmt(full[k])}" for k in keys), full.get("model", "byte"))


def warm_name(probe: str, horizon: int, model: str = "byte") -> str:
  return _model(f"probe={probe},horizon={horizon}", model)


@dataclasses.dataclass(frozen=True)
class Cell:
  label: str   # how the report's table names it
  args: dict   # configs/study.py arguments (the rest at DEFAULTS)

  @property
  def name(self) -> str:
    return cell_name(self.args)

  @property
  def full(self) -> dict:
    """Every configs/study.py argument of the cell (its own, the rest at DEFAULTS)."""
    return {**DEFAULTS, **self.args}

  @property
  def warm(self) -> str:
    return warm_name(self.full["probe"], self.full["horizon"], self.full.get("model", "byte"))


@dataclasses.dataclass(frozen=True)
class Experiment:
  id: str
  title: str
  question: str
  claim: str
  source: str
  cells: tuple[Cell, ...]
  # (better, worse): the claim says the first cell's label beats the second's
  comparisons: tuple[tuple[str, str], ...]
  note: str = ""  # what the setup changes from the paper's, in a sentence
  figure: str = "curves"  # curves: success vs tokens per cell | bars: final success per cell
  seeds: tuple = SEEDS  # the seeds every cell runs
  # Positive controls (real, shuffled): the reference arm beats its advantages shuffled within the
  # batch wherever RL can be measured at all; one per probe task (probe and horizon) the experiment runs on.
  controls: tuple[tuple[str, str], ...] = ()
  # Contrasts that isolate one factor, (a, b, factor): reported with the claims (and in their Holm
  # family) but judged as differences, not as a published claim.
  factors: tuple[tuple[str, str, str], ...] = ()
  # Why the experiment is not in this round's runs (its cells stay planned); "" = run.
  cut: str = ""

  def cell(self, label: str) -> Cell:
    for c in self.cells:
      if c.label == label:
        return c
    raise KeyError(f"{self.id}: no cell {label!r}")

  def control_for(self, label: str) -> tuple[str, str] | None:
    """The positive control a comparison of `label` is powered by: the only one, or the one on the
    same probe task (probe and horizon: a control separates or not at its own horizon)."""
    if len(self.controls) <= 1:
      return self.controls[0] if self.controls else None
    warm = self.cell(label).warm
    return next((c for c in self.controls if self.cell(c[0]).warm == warm), None)


def shuffled(cell: Cell, label: str) -> Cell:
  """The cell with its advantages shuffled within the batch (the positive control's B side)."""
  return Cell(label, {**cell.args, "shuffle": True})


# The horizon sweep (issue 32) runs on `delayed` (configs/study.py): turn 0's choice is paid at the last
# turn, through per-session noise on every turn between, so the choice's credit has to cross H turns
# (2H action tokens at one letter an action). Tokens per action stay 1 here (the probe takes up to ~100;
# cut to fit the CPU budget).
HORIZONS = (2, 8, 32)
# E1's arms: the claim's (lambda 0.95 against lambda 1 and against outcome credit) and Dr. GRPO for the
# normalisation factor. Cut to fit 8 seeds on 2 CPU cores: gae_length_adaptive_alpha2, rloo (dr_grpo times
# G / (G - 1): scale only), return_to_go_gamma0.9, turn_gae, bilevel_gae, tree.
E1_ARMS = ("ms_grpo", "dr_grpo", "gae_lambda0.95", "gae_lambda1")
ETAS = (0, 1, 2, 4, 8)  # AReaL's ablation
# The credit-accuracy lab runs on the bifurcation and memory warm starts (docs/lab.md); not in this round.
LAB_PROBES = ("bifurcation", "memory")
LAB_HORIZON = 8


def _h(label: str, h: int) -> str:
  return f"{label} h{h}"


def _control(h: int) -> tuple[Cell, Cell]:
  """Every delayed experiment's positive control at horizon h: ms_grpo against its advantages shuffled
  (the same two runs serve E1, E3 and E4 at that horizon)."""
  real = Cell(_h("ms_grpo", h), {"horizon": h, "arm": "ms_grpo"})
  return real, shuffled(real, _h("ms_grpo shuffled", h))


def _controls(horizons) -> tuple[tuple[str, str], ...]:
  """The (real, shuffled) control pair at each horizon, by the labels _control gives them."""
  return tuple((_h("ms_grpo", h), _h("ms_grpo shuffled", h)) for h in horizons)


def _e1() -> Experiment:
  cells = tuple(Cell(_h(arm, h), {"horizon": h, "arm": arm}) for h in HORIZONS for arm in E1_ARMS)
  cells += tuple(_control(h)[1] for h in HORIZONS)
  comps = tuple((_h(a, h), _h("gae_lambda0.95", h)) for h in HORIZONS for a in ("gae_lambda1", "ms_grpo"))
  factors = tuple((_h("ms_grpo", h), _h("dr_grpo", h), "normalisation (std vs mean-only), outcome credit")
                  for h in HORIZONS)
  return Experiment(
      "E1", "lambda x horizon",
      "Does GAE with lambda 0.95 lose the turn-0 choice as the turns between it and its payoff grow, where "
      "lambda 1 and outcome credit (MS-GRPO) keep it?",
      "Token-level GAE with lambda 0.95 and a learned critic under-credits actions far from the reward; "
      "lambda 1 and outcome-based MS-GRPO do not.",
      "VC-PPO (arXiv 2503.01491), VAPO (arXiv 2504.05118), MS-GRPO (arXiv 2508.10839)",
      cells, comps, controls=_controls(HORIZONS),
      factors=factors,
      note=f"`delayed` at horizons {', '.join(map(str, HORIZONS))} (one letter an action: about 2H action "
           "tokens a session); lambda 0.95 puts 0.95^(2H) of the payoff's credit on turn 0 before the critic "
           "(0.81 at H=2, 0.44 at H=8, 0.04 at H=32); ms_grpo is GRPO (the session layout); Dr. GRPO for the "
           "normalisation factor")


def _e2() -> Experiment:
  cells = tuple(Cell(f"{'decoupled' if d else 'naive'} eta={eta}",
                     {"eta": eta, "decoupled": d} if eta else {})
                for d in (True, False) for eta in ETAS if eta or d)
  cells += (shuffled(cells[0], "shuffled eta=0"),)
  comps = tuple((f"decoupled eta={eta}", f"naive eta={eta}") for eta in ETAS if eta >= 4)
  return Experiment(
      "E2", "Decoupled vs naive PPO under staleness",
      "Does the decoupled objective (proximal policy = the learner's current one) keep stale data useful?",
      "With staleness eta >= 4, naive PPO degrades while decoupled PPO keeps its final success.",
      "AReaL (arXiv 2505.24298), Table 5 / Fig. 5",
      cells, comps, controls=(("decoupled eta=0", "shuffled eta=0"),),
      note="grpo advantages, delayed h8, 2 actors; eta = 0 is the synchronous learner (both objectives "
           "coincide there); staleness measured from the token versions", figure="bars",
      cut="not a credit-assignment question; the CPU budget runs E1, E3, E4 and E6 (issue 32)")


def _e3() -> Experiment:
  cells = tuple(c for h in HORIZONS for c in (
      Cell(_h("gae_lambda0.95 vp=on", h), {"horizon": h, "arm": "gae_lambda0.95"}),
      Cell(_h("gae_lambda0.95 vp=off", h), {"horizon": h, "arm": "gae_lambda0.95", "vp": False}),
      *_control(h)))
  return Experiment(
      "E3", "Value pretraining",
      "Does fitting the critic on the warm-start policy's returns before RL help PPO, more so when the "
      "payoff is far?",
      "Value pretraining removes the early collapse that a randomly initialised critic causes and "
      "improves PPO's final result.",
      "VC-PPO (arXiv 2503.01491) section 3.2; VAPO (arXiv 2504.05118)",
      cells, tuple((_h("gae_lambda0.95 vp=on", h), _h("gae_lambda0.95 vp=off", h)) for h in HORIZONS),
      controls=_controls(HORIZONS),
      note="`delayed` at each horizon; vp=on starts RL from the probe's pretrained critic (Monte-Carlo "
           "targets of the warm start's sessions), vp=off from a critic whose value head is 0; the positive "
           "control is E1's (ms_grpo against its advantages shuffled, the same runs)")


def _e4() -> Experiment:
  cells = tuple(c for h in HORIZONS for c in (
      Cell(_h("policy 0.95 critic 1.0", h), {"horizon": h, "arm": "gae_decoupled"}),
      Cell(_h("policy 0.95 critic 0.95", h), {"horizon": h, "arm": "gae_lambda0.95"}),
      Cell(_h("policy 1.0 critic 1.0", h), {"horizon": h, "arm": "gae_lambda1"}),
      *_control(h)))
  return Experiment(
      "E4", "Decoupled lambda",
      "Is a critic fitted with lambda 1 and a policy advantage with lambda 0.95 better than a shared 0.95?",
      "Decoupled lambda (critic 1.0, policy 0.95) beats a shared lambda of 0.95.",
      "VC-PPO (arXiv 2503.01491) section 3.3",
      cells, tuple((_h("policy 0.95 critic 1.0", h), _h("policy 0.95 critic 0.95", h)) for h in HORIZONS),
      controls=_controls(HORIZONS),
      note="`delayed` at each horizon; the shared 1.0 corner is E1's gae_lambda1 (shown, not compared); the "
           "(1.0, 0.95) corner is cut; the positive control is E1's", figure="bars")


def _e5() -> Experiment:
  cells = (Cell("trajectory grpo", {"arm": "grpo"}),
           Cell("ms_grpo session", {"arm": "ms_grpo"}),
           Cell("ms_grpo turn history", {"arm": "ms_grpo", "context": "history"}),
           Cell("ms_grpo turn markov", {"arm": "ms_grpo", "context": "markov"}),
           Cell("trajectory grpo shuffled", {"arm": "grpo", "shuffle": True}))
  return Experiment(
      "E5", "MS-GRPO per-turn samples vs trajectory GRPO",
      "Does crediting the episode return to every turn as its own sample beat trajectory-level GRPO?",
      "MS-GRPO (per-turn samples, Markov context) trains multi-step agents better than trajectory GRPO.",
      "MS-GRPO (arXiv 2508.10839)",
      cells, (("ms_grpo turn markov", "trajectory grpo"), ("ms_grpo turn history", "trajectory grpo")),
      controls=(("trajectory grpo", "trajectory grpo shuffled"),),
      note="delayed h8; `session` = the same return on every turn in one sample per session",
      cut="the CPU budget runs E1, E3, E4 and E6 (issue 32)")


# E6 runs on `revisit`: a slippery corridor whose cells recur within a session and across a group at
# different turns, so GiGPO's step groups (same cell) differ from episode groups. The 2 x 2 of
# {outcome, step groups} x {std, mean-only} is ms_grpo, dr_grpo, gigpo_std, gigpo; hgpo beside them.
# Cut to fit the CPU budget: mt_grpo, progress, rloo.
E6_ARMS = ("ms_grpo", "dr_grpo", "gigpo", "gigpo_std", "hgpo")
E6_HORIZONS = (4, 16)
E6_SEEDS = SEEDS


def _e6() -> Experiment:
  cells = tuple(Cell(_h(arm, h), {"probe": "revisit", "horizon": h, "arm": arm})
                for h in E6_HORIZONS for arm in E6_ARMS)
  cells += tuple(shuffled(Cell(_h("ms_grpo", h), {"probe": "revisit", "horizon": h, "arm": "ms_grpo"}),
                          _h("ms_grpo shuffled", h)) for h in E6_HORIZONS)
  comps = tuple((_h(a, h), _h(b, h)) for h in E6_HORIZONS for a, b in (("gigpo", "ms_grpo"), ("hgpo", "gigpo")))
  factors = tuple((_h(a, h), _h(b, h), what) for h in E6_HORIZONS for a, b, what in (
      ("ms_grpo", "dr_grpo", "normalisation (std vs mean-only), outcome credit"),
      ("gigpo_std", "gigpo", "normalisation (std vs mean-only), step-group credit"),
      ("gigpo", "dr_grpo", "credit structure (step groups vs outcome), both mean-only"),
      ("gigpo_std", "ms_grpo", "credit structure (step groups vs outcome), both std-scaled")))
  return Experiment(
      "E6", "Step-level credit without a critic",
      "Do step groups on recurring states (GiGPO) or nested history groups (HGPO) credit a corridor's moves "
      "better than outcome-only credit, and how much of any difference is normalisation?",
      "GiGPO beats GRPO (ALFWorld, WebShop); HGPO beats GiGPO.",
      "GiGPO (arXiv 2505.10978), HGPO (arXiv 2602.22817)",
      cells, comps, controls=_controls(E6_HORIZONS),
      factors=factors,
      note=f"`revisit` at horizons {', '.join(map(str, E6_HORIZONS))} (a corridor of H // 2 + 1 cells; the "
           "anchor state is the cell, with no turn in it); ms_grpo stands for GRPO (the session layout); "
           "h16 was not run past one seed of one cell: its warm start succeeds 0.08 and that run (dr_grpo, "
           "seed 0) lost the reply format (invalid replies up to 100% of turns, success 0.00), so the byte model "
           "cannot test E6 there with this recipe")




EXPERIMENTS = (_e1(), _e2(), _e3(), _e4(), _e5(), _e6())

# The study on the real model (issue 32 item 8: one command, <= 9 minutes on one GPU): E1's claim cells
# (ms_grpo and gae lambda 1 against gae lambda 0.95) and its positive control (ms_grpo shuffled) at the
# two short horizons, 2 seeds: 2 policy warm starts, 2 critic warm starts, 16 runs, each cell at
# configs/study.py's model=smol sizes (256 demos, 32 SFT steps; 16 RL updates of 8 tasks x 4 sessions;
# eval on 128 tasks). dr_grpo (the normalisation factor) and h32 are left to a longer window.
# Estimate on one H100/H200 (not run on a GPU yet; basis: /work/shared/STACK.md's H100 numbers for
# configs/smol.py, where compiling is ~85% of a short run: first RL update 40 s, then 0.22-0.30 s per
# update of 32 sessions, behaviour cloning 48 s for 16 steps; its 16-update job ~96 s, docs/accelerator.md):
# a job is ~15 s of start-up and weights, ~40-60 s of compiling where the persistent cache (ROOT/jax_cache)
# has not got its programs yet, ~5 s where it has, and little work (a session is 114 tokens at h2 and 216
# at h8: an update's 32 sessions are <= 12k token slots, ~0.1 s of the learner at the measured 42k tokens/s
# of a 4x larger policy + critic; rollouts of 2-8 one-token turns). With --parallel 8: the warm starts
# ~100 s, the critics ~90 s, the 16 runs in 2 waves ~100 s + ~50 s: ~6 min, 9 min with 50% to spare.
SMOL_HORIZONS = (2, 8)
SMOL_ARMS = ("ms_grpo", "gae_lambda0.95", "gae_lambda1")  # the control's cells are ms_grpo's, shuffled
SMOL_SEEDS = (0, 1)
SMOL_RECORDS = os.path.join(records.REPO, "docs", "study_smol")  # the byte study's report never reads them


def _e1_smol() -> Experiment:
  """E1 cut to SMOL_HORIZONS x SMOL_ARMS (and the control), every cell with model=smol."""
  e1 = _e1()
  cells = tuple(Cell(c.label, {**c.args, "model": "smol"}) for c in e1.cells
                if c.full["horizon"] in SMOL_HORIZONS and c.full["arm"] in SMOL_ARMS)
  have = {c.label for c in cells}
  return dataclasses.replace(
      e1, title=e1.title + " on SmolLM2-135M-Instruct", cells=cells, seeds=SMOL_SEEDS,
      comparisons=tuple(p for p in e1.comparisons if set(p) <= have),
      controls=tuple(p for p in e1.controls if set(p) <= have),
      factors=tuple(f for f in e1.factors if set(f[:2]) <= have),
      note=f"`delayed` at horizons {', '.join(map(str, SMOL_HORIZONS))} in English (style natural) through "
           "SmolLM2's chat template, from a behaviour-cloned warm start of the pretrained model "
           "(configs/study.py:model=smol); dr_grpo and h32 not run")


SMOL_EXPERIMENTS = (_e1_smol(),)


def plan(model: str = "byte") -> tuple[Experiment, ...]:
  """The experiments of one model: the study (byte) or its real-model cut (smol)."""
  if model not in ("byte", "smol"):
    raise ValueError(f"model={model!r}: choose byte or smol")
  return SMOL_EXPERIMENTS if model == "smol" else EXPERIMENTS


def experiment(eid: str, model: str = "byte") -> Experiment:
  for e in plan(model):
    if e.id == eid:
      return e
  raise KeyError(f"no experiment {eid!r}; have {[e.id for e in plan(model)]}")


def planned_runs(ids=None, seeds=None, probe=None, horizons=None, model="byte") -> dict[str, Cell]:
  """run folder name -> cell, over the chosen experiments (each shared cell once; by default those not
  cut from this round); each experiment's own seeds unless `seeds` is given; only one probe's cells if
  `probe` is given, only these horizons' if `horizons` is; `model` smol: the real model's plan."""
  out = {}
  for e in plan(model):
    if (ids and e.id not in ids) or (not ids and e.cut):
      continue
    for c in e.cells:
      if (probe and c.full["probe"] != probe) or (horizons and c.full["horizon"] not in horizons):
        continue
      for s in (e.seeds if seeds is None else seeds):
        out[f"{c.name},seed={s}"] = c
  return out


def warm_command(python: str, root: str, warm: str) -> tuple[list[str], str]:
  workdir = os.path.join(root, "warm", warm)
  return command(python, f"{CONFIG}:{warm},stage=warm", workdir, []), workdir


CRITIC_ARMS = {"gae_lambda0.95", "gae_lambda1", "gae_decoupled", "gae_length_adaptive_alpha2", "turn_gae",
               "bilevel_gae"}
# One pretrained critic per probe: every seed's RL starts from the same policy warm start, so they
# start from the same critic fitted to it too (value pretraining is ~10 CPU-minutes a critic).
CRITIC_SEED = 0


def critic_warm(cell: Cell, seed: int) -> str | None:
  """The critic warm start a run starts from (critic arms with value pretraining on), or None.
  `seed` is the run's; all seeds share the probe's critic (CRITIC_SEED)."""
  full = cell.full
  if full["arm"] not in CRITIC_ARMS or not full["vp"]:
    return None
  return f"{cell.warm},critic,seed={CRITIC_SEED}"


def critic_command(python: str, root: str, name: str) -> tuple[list[str], str]:
  """Value pretraining of one probe's critic at one seed, from the probe's policy warm start."""
  warm, _, seed = name.rpartition(",critic,seed=")
  workdir = os.path.join(root, "warm", name)
  return command(python, f"{CONFIG}:{warm},stage=critic,seed={seed}", workdir,
                 [f"--config.init_from={os.path.join(root, 'warm', warm)}"]), workdir


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


def _timed(name, cmd, workdir, in_process=False):
  name, rc, secs = run_job(name, cmd, workdir, in_process)
  if rc == 0:
    with open(os.path.join(workdir, "wall.json"), "w") as f:
      json.dump({"wall_s": secs}, f)
  return name, rc, secs


def _results(jobs, parallel: int, in_process: bool):
  """(name, rc, seconds) of each job as it ends: `parallel` processes, or one by one in this one."""
  if in_process:
    for j in jobs:
      yield _timed(*j, in_process=True)
    return
  with cf.ThreadPoolExecutor(parallel) as pool:
    futures = [pool.submit(_timed, *j) for j in jobs]
    for fut in cf.as_completed(futures):
      yield fut.result()


def _pool(jobs, parallel: int, what: str, on_done=None, in_process: bool = False) -> list[str]:
  """Runs the jobs; `on_done(name, workdir)` after each one that finished (its record).
  `in_process`: the main-job runs one after another in this process (sweep.run_job)."""
  failed, done = [], 0
  t0 = time.time()
  for name, rc, secs in _results(jobs, parallel, in_process):
    done += 1
    status = "ok" if rc == 0 else f"FAILED rc={rc}"
    left = (time.time() - t0) / done * (len(jobs) - done)
    print(f"[{what} {done}/{len(jobs)} {secs:6.1f}s, ~{left / 60:.0f} min left] {status}: {name}", flush=True)
    if rc:
      failed.append(name)
    elif on_done:
      on_done(name, dict((j[0], j[2]) for j in jobs)[name])
  return failed


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--root", required=True)
  p.add_argument("--only", default="", help="comma-separated experiment ids (default: all)")
  p.add_argument("--seeds", type=int, default=None,
                 help="seeds 0..N-1 per cell (default: each experiment's own, 8)")
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
  p.add_argument("--dry_run", action="store_true")
  p.add_argument("--python", default=sys.executable)
  p.add_argument("--records", default=None,
                 help="where each finished run, warm start and critic warm start writes its record "
                      "(default docs/study, what the report reads; docs/study_smol with --model smol; '' = none)")
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
  if a.records is None:
    a.records = SMOL_RECORDS if a.model == "smol" else records.DEFAULT_OUT
  ids = [x for x in a.only.split(",") if x]
  for eid in ids:
    experiment(eid, a.model)
  root = os.path.abspath(a.root)
  try:
    horizons = tuple(int(h) for h in a.horizons.split(",") if h)
  except ValueError:
    p.error(f"--horizons {a.horizons!r}: comma-separated integers")
  runs = planned_runs(ids, None if a.seeds is None else tuple(range(a.seeds)), a.probe or None, horizons or None,
                      model=a.model)
  if a.arms:
    keep = set(a.arms.split(","))
    arms = {c.full["arm"] for e in plan(a.model) for c in e.cells}
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
  os.makedirs(root, exist_ok=True)
  if a.model == "smol":  # --parallel N processes share one GPU: none may take 75% of its memory up front
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  # JAX's persistent compilation cache, shared by the runs: every run compiles the same
  # functions (same shapes), so all but the first load them (measured on the 2-core CPU:
  # one bifurcation run 66 s without the cache, 23 s with it; identical results). The runs'
  # config.compile_cache "auto" points at ROOT/jax_cache (mtrl_jax/compile_cache.py);
  # --config.compile_cache=DIR (or '' for none) still wins.
  os.environ.setdefault(compile_cache.ENV, os.path.join(root, "jax_cache"))
  with open(os.path.join(root, "study.json"), "a") as f:
    f.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:] if argv is None
                        else list(argv), "runs": len(run_jobs), "warm": len(warm_jobs)}) + "\n")
  warm_todo = [j for j in warm_jobs if not _warm_done(j[2])]
  print(f"study: {len(warm_todo)} of {len(warm_jobs)} warm starts to build, parallel={a.parallel}", flush=True)
  def record(name, workdir):  # the record of a finished job, in the repo (experiments/records.py)
    if a.records:
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
  critic_todo = [j for j in critic_jobs if not _critic_done(j[2])]
  print(f"study: {len(critic_todo)} of {len(critic_jobs)} critic warm starts to build", flush=True)
  failed = _pool(critic_todo, a.parallel, "critic", record, in_process=a.in_process)
  if failed:
    print(f"study: critic warm starts failed: {failed}; relaunch to retry", file=sys.stderr)
    print(json.dumps({"warm_starts": len(warm_jobs), "critic_failed": failed}))
    return 1
  if a.warm_only:
    print(json.dumps({"warm_starts": len(warm_jobs), "critic_warm_starts": len(critic_jobs), "warm_failed": []}))
    return 0
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
  summary = {"warm_starts": len(warm_jobs), "runs": len(run_jobs), "ran": len(todo), "failed": failed}
  if failed:
    print(f"study: {len(failed)} runs failed: {', '.join(failed)}; relaunch to retry", file=sys.stderr)
    print(json.dumps(summary))
    return 1
  print(f"study: done; python experiments/report.py --records {a.records or 'DIR'}")
  print(json.dumps(summary))
  return 0


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


def _critic_done(workdir: str) -> bool:
  """A critic warm start is done when value pretraining wrote its final readout."""
  return any(r.get("value_pretrain/final") for r in read_metrics(workdir))


def _warm_done(workdir: str) -> bool:
  """A warm start is done when its sft stage wrote its evaluation."""
  return any(r.get("stage") == "sft" and "eval/success" in r for r in read_metrics(workdir))


if __name__ == "__main__":
  sys.exit(main())
