"""The credit-assignment study's plan: its experiments, their cells and the probe tasks, as data.

Each experiment names its question, the published claim and its source, its
cells (argument sets of configs/study.py) and the comparisons the claim makes
("cell A beats cell B"). A run is one cell at one seed; a cell used by several
experiments (E1's ms_grpo and its shuffled control serve E3 and E4) is one run
folder, run once. Every RL run of a probe starts from that probe's warm start;
critic arms with value pretraining on start from the probe's one *critic warm
start* (`critic_warm`): the policy warm start plus a critic pretrained on it.

Every experiment carries a positive control: a pair whose difference must
exist if the design can see anything (the experiment's reference arm against
the same arm with its advantages shuffled within the batch). The report
(report.py) judges the claims by paired per-seed differences (stats.py) and
calls a claim whose control does not separate "underpowered".

`PROBES` lists every probe task with the horizon its warm start is measured
at (the report's probe table). `SMOL_EXPERIMENTS` is the same design cut to
the real model (configs/study.py:model=smol; docs/accelerator.md).

Pure data and naming: this module imports nothing of the study, so every
other part of it (records, runner, verdicts, report) can import it.
"""
from __future__ import annotations

import dataclasses

CONFIG = "configs/study.py"
SEEDS = tuple(range(8))
# configs/study.py's defaults for the keys a cell may set; a cell's name lists
# probe, horizon and arm always, the other keys only where they differ.
DEFAULTS = {"probe": "delayed", "horizon": 8, "arm": "grpo", "lp": -1.0, "lc": -1.0, "eta": 0,
            "decoupled": True, "vp": True, "context": "session", "shuffle": False,
            # The third round's (round3.py): graded control q, the cue probe, seeded draws, a partial critic.
            "dshuffle": 0.0, "cue": False, "draws": False, "vpr": 0.0,
            # RL's passes and minibatches an update (configs/study.py): 1 x 1 is the second round's recipe.
            "epochs": 1, "mb": 1,
            # Advantages whitened over each update's action tokens, the updates a run has, RL's learning rate,
            # the KL penalty to the warm start.
            "whiten": False, "updates": 32, "lr": 5e-4, "kl": 0.0}
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


def warm_name(probe: str, horizon: int, model: str = "byte", cue: bool = False) -> str:
  """The policy warm start's folder name; `cue` (delayed's sign, round 3) is part of what it learned."""
  return _model(f"probe={probe},horizon={horizon}" + (",cue=true" if cue else ""), model)


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
    return warm_name(self.full["probe"], self.full["horizon"], self.full.get("model", "byte"), self.full["cue"])


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
           "h16 was not run past one seed of one cell: its warm start succeeds 0.094 (its own eval, 64 tasks) and "
           "that run (dr_grpo, seed 0) lost the reply format (invalid replies up to 100% of turns, success 0.00), "
           "so the byte model cannot test E6 there with this recipe")




EXPERIMENTS = (_e1(), _e2(), _e3(), _e4(), _e5(), _e6())

# Files of mtrl_jax/ and configs/ the records of two compared cells may differ in, and why (versions.py:
# the report refuses any other difference). The committed records were made at two commits, be2e9bc
# (critic-free arms) and 28f5aef (critic arms, critic warm starts); git diff between them, restricted to
# mtrl_jax/ and configs/, is these six files. Checked 2026-11-28: configs/study.py at the two commits
# builds the same config for all 264 planned runs and 5 warm starts but for one added field,
# value_pretrain.readout_tasks, which only the value-pretraining stage reads, and an RL run started from
# a critic warm start skips that stage (train/run.py restores the pretrained critic instead).
CODE_MAY_DIFFER = (
    ("configs/smol.py", "the real model's settings: no byte cell reads them"),
    ("configs/study.py", "model=smol added, and the critic stage's readout size (value_pretrain.readout_tasks): "
                         "every byte run's config is the same but for that field, read by value pretraining only"),
    ("configs/common.py", "shrink() (runlocal smoke sizes only) sets the readout size"),
    ("mtrl_jax/config.py", "the field value_pretrain.readout_tasks (default 0: the old single-round readout) and "
                           "its check"),
    ("mtrl_jax/train/value_pretrain.py", "the critic warm start's final readout, after fitting (more tasks, "
                                         "with intervals); RL runs do not run value pretraining"),
    ("mtrl_jax/train/critic_readout.py", "session-bootstrap intervals added to the readout (off unless asked: "
                                         "the RL stage's readouts unchanged)"),
)

# The study on the real model (issue 32 item 8: one command, <= 9 minutes on one GPU): E1's claim cells
# (ms_grpo and gae lambda 1 against gae lambda 0.95) and its positive control (ms_grpo shuffled) at the
# two short horizons, 2 seeds: 2 policy warm starts, 2 critic warm starts, 16 runs, each cell at
# configs/study.py's model=smol sizes (256 demos, 32 SFT steps; 16 RL updates of 8 tasks x 4 sessions;
# eval on 128 tasks). dr_grpo (the normalisation factor) and h32 are left to a longer window.
# Estimate on one H100/H200 (not run on a GPU yet; basis: numbers a development session measured on one
# H100 on 2026-11-28 at commit acf1d62, not kept in this repository, for configs/smol.py, where compiling is
# ~85% of a short run: first RL update 40 s, then 0.22-0.30 s per
# update of 32 sessions, behaviour cloning 48 s for 16 steps; its 16-update job ~96 s, docs/accelerator.md):
# a job is ~15 s of start-up and weights, ~40-60 s of compiling where the persistent cache (ROOT/jax_cache)
# has not got its programs yet, ~5 s where it has, and little work (a session is 114 tokens at h2 and 216
# at h8: an update's 32 sessions are <= 12k token slots, ~0.1 s of the learner at the measured 42k tokens/s
# of a 4x larger policy + critic; rollouts of 2-8 one-token turns). With --parallel 8: the warm starts
# ~100 s, the critics ~90 s, the 16 runs in 2 waves ~100 s + ~50 s: ~6 min, 9 min with 50% to spare.
SMOL_HORIZONS = (2, 8)
SMOL_ARMS = ("ms_grpo", "gae_lambda0.95", "gae_lambda1")  # the control's cells are ms_grpo's, shuffled
SMOL_SEEDS = (0, 1)


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


def planned_runs(ids=None, seeds=None, probe=None, horizons=None, model="byte",
                 experiments=None) -> dict[str, Cell]:
  """run folder name -> cell, over the chosen experiments (each shared cell once; by default those not
  cut from this round); each experiment's own seeds unless `seeds` is given; only one probe's cells if
  `probe` is given, only these horizons' if `horizons` is; `model` smol: the real model's plan;
  `experiments`: another round's (round3.EXPERIMENTS) instead of `plan(model)`."""
  out = {}
  for e in (plan(model) if experiments is None else experiments):
    if (ids and e.id not in ids) or (not ids and e.cut):
      continue
    for c in e.cells:
      if (probe and c.full["probe"] != probe) or (horizons and c.full["horizon"] not in horizons):
        continue
      for s in (e.seeds if seeds is None else seeds):
        out[f"{c.name},seed={s}"] = c
  return out


CRITIC_ARMS = {"gae_lambda0.95", "gae_lambda1", "gae_decoupled", "gae_length_adaptive_alpha2", "turn_gae",
               "bilevel_gae"}
# One pretrained critic per probe: every seed's RL starts from the same policy warm start, so they
# start from the same critic fitted to it too (value pretraining is ~10 CPU-minutes a critic).
CRITIC_SEED = 0


def critic_warm(cell: Cell, seed: int) -> str | None:
  """The critic warm start a run starts from (critic arms with value pretraining on), or None.
  `seed` is the run's; all seeds share the probe's critic (CRITIC_SEED). A partial critic (`vpr`,
  value pretraining stopped at that ratio of the oracle's EV) is its own critic warm start."""
  full = cell.full
  if full["arm"] not in CRITIC_ARMS or not full["vp"]:
    return None
  vpr = f",vpr={_fmt(full['vpr'])}" if full["vpr"] else ""
  return f"{cell.warm}{vpr},critic,seed={CRITIC_SEED}"


def policy_warm(critic_name: str) -> str:
  """The policy warm start a critic warm start (critic_warm's name) is pretrained from."""
  head = critic_name.rpartition(",critic,seed=")[0]
  return ",".join(p for p in head.split(",") if not p.startswith("vpr="))
