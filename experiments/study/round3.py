"""The study's third round (issue 41), pre-registered as data before any of its runs.

What changes from the second round (plan.py, whose records and report stay as they are):
- The probe is `delayed(cue=True)` (envs/delayed.py): turn 0's sign says which arm pays and it differs
  across tasks, so the decision is learned from the observation, not inherited (the warm start follows
  the sign about half the time: 0.484 sampled at H=2, 0.516 at H=8, docs/critic.md). Its hidden draws are
  salted by the seed (`draws=true`: draw_seed = seed), so eval draws differ between seeds.
- The critic's quality is a factor of E1: none (no value pretraining), partial (value pretraining stopped
  at PARTIAL_RATIO of the oracle's explained variance) and full (stopped at the bar, the defaults).
- The horizon x lambda interaction under the partial critic is the pre-registered test, its own Holm
  family (INTERACTION_FAMILY).
- Every probe task (horizon) has a graded positive control (configs/study.py `dshuffle=q`,
  credit/shuffle.py): a fraction q in GRADED_Q of the sessions get another session's decision-turn
  advantage, the other turns keep theirs. The smallest q whose effect the design detects bounds what a
  "no difference" verdict may say. At the second round's recipe 4 of 18 pilot control runs lost the reply
  format; at this round's RECIPE (with its KL penalty) none of the pilot's controls did (at most 4.7% of an
  update's turns invalid, docs/STUDY_ROUND3.md).
- E2 (decoupled vs naive PPO through the async queue), E5 (trajectory GRPO vs MS-GRPO's per-turn samples)
  and VAPO's length-adaptive GAE (an arm of E1) are cells again; E6 is recorded "not tested" (E6_REASON).

Re-registered (2026-11-29) at RECIPE, before any of the round's runs: 32 updates of 8 tasks x 4 sessions,
each 8 passes of 4 minibatches (32 Adam steps), lr 2.5e-4, a KL penalty of 0.1 to the warm start. At the
second round's recipe (one Adam step an update) no arm learned the cue at H=8 in 32 or 128 updates
(docs/critic.md); RECIPE_NOTE says what the pilots behind RECIPE measured.
`python -m experiments.study --round 3 --root R --dry_run` lists the jobs.
"""
from __future__ import annotations

import dataclasses

from experiments.study import plan
from experiments.study.plan import SEEDS, Cell, Experiment

HORIZONS = (2, 8, 32)
# Amendment 1 (docs/STUDY_ROUND3.md, registered 2026-12-01 before its runs): the machine kinds that may add
# whole seed blocks (one horizon at one seed), each with its own starts, in its own records folder (relative
# to the repo). The first is the round's own. kinds.py reads this; the report pools every folder's runs.
MACHINE_KINDS = (("docs/study3", "AMD EPYC (2 cores)"),
                 ("docs/study3_xeon", "Intel Xeon, family 6 model 167 (2 cores)"))
# The files this round's records may differ in: round 2's (plan.CODE_MAY_DIFFER) with two changes made after
# the round's first registered runs, before any H=32 critic existed. The H=32 pilot critic stopped on a pooled
# window of 0.948 [0.872, 1.03] and read 0.419 [0.33, 0.51] on fresh tasks (docs/STUDY_ROUND3.md), and under
# the study's two parallel jobs the default 3,600 s cap would have stopped it on the load, not its readouts.
ROUND3_MAY_DIFFER = {
    "configs/study.py": "round 3: no wall-time cap on value pretraining (value_pretrain.max_seconds 0), so "
                        "where a critic stops does not depend on the machine's load",
    "mtrl_jax/train/value_pretrain.py": "round 3: a stop at the bar confirmed by the critic's own readout. A "
                                        "critic that passes is the one the old rule gave: the committed H=2 "
                                        "full critic rebuilt under the check read the same to the last digit",
}
CODE_MAY_DIFFER = tuple((path, f"{why}; {ROUND3_MAY_DIFFER[path]}" if path in ROUND3_MAY_DIFFER else why)
                        for path, why in plan.CODE_MAY_DIFFER)
WHERE = "experiments/study/round3.py `CODE_MAY_DIFFER`"  # as the report names it
# Value pretraining stopped at 0.3 of the oracle's EV. The rule stops on a round's own ratio, read before the
# round is fitted, and the critic's EV rises steeply once it finds the decision (H=8, seed 0: 0.085, 0.185,
# 0.383, 0.655 of the oracle's in four consecutive rounds), so the target decides which round stops, not
# where the readout lands. Pilots (2026-11-29, docs/STUDY_ROUND3.md): at 0.3 the handed-over critics read
# 0.369 [0.357, 0.380] (H=8) and 0.371 [0.361, 0.381] (H=2) of the oracle on fresh tasks, inside the band; at
# the first registration's 0.45 the H=8 critic read 0.643 [0.624, 0.659], outside it. At H=32 the full
# critic's own ratio went 0.09, 0.24, 0.53, 0.93 in rounds 26-29, so 0.3 stops at the round that read 0.53.
# Each partial critic's final readout is recorded beside its results.
PARTIAL_RATIO = 0.3
# The registered band a partial critic is judged by (issue 41: "an EV ratio of about 0.3-0.6, stated from its
# readout"): a partial cell's claims are tested when its handed-over critic's point ratio lies in it, "not
# tested" otherwise; the 0.8 bar (mtrl_jax/train/critic_bar.py) judges the full critics only
# (experiments/study/verdicts.py).
PARTIAL_BAND = (0.3, 0.6)
CRITICS = {"none": {"vp": False}, "partial": {"vpr": PARTIAL_RATIO}, "full": {}}
# E1's lambdas: 0.95, 1 and VAPO's length-adaptive lambda = 1 - 1 / (alpha l), l = the session's action
# tokens. delayed(cue)'s sessions have l of 7.5 and 19.5 generated tokens at H = 2 and 8 (the pilot's
# ledger: the arm's word and a stop token at turn 0, a letter and a stop token a relay turn), so about 68
# at H = 32; at alpha 2 (configs/study.py's arm) lambda is 0.93, 0.974 and 0.993: VAPO's regime (its alpha
# 0.05 on outputs of hundreds to thousands of tokens gives 0.9-0.999). gae's default alpha 0.05 would give
# lambda 0 here (1 / (alpha l) > 1, clamped).
LAMBDA_ARMS = ("gae_lambda0.95", "gae_lambda1", "gae_length_adaptive_alpha2")
# q = 0.1 was added at the re-registration: on the recipe pilot's seed 0 (H=8, MS-GRPO) it cost 0.039 of success,
# the size of the claims' effects, where q = 0.25 cost 0.137 (docs/STUDY_ROUND3.md).
GRADED_Q = (1.0, 0.5, 0.25, 0.1)
# The graded control's reference arms: MS-GRPO (critic-free, every experiment's arm without a critic) and
# GAE(0.95) with the full critic, the arm that learned the cue at H=2 in issue 43's runs (following the
# sign 0.75 and 0.645 on seeds 0 and 1, where MS-GRPO stayed at 0.52-0.54).
CONTROL_REFS = (("ms_grpo", ""), ("gae_lambda0.95", "full"))  # (arm, critic state)
E2_ETAS = (4, 8)
E2_HORIZONS = (2, 8)
E5_HORIZONS = (2, 8)
INTERACTION_FAMILY = "E1 horizon x lambda, partial critic"

RECIPE_NOTE = (
    "Registered at round3.RECIPE (32 updates, each 8 x 4 Adam steps, lr 2.5e-4, KL 0.1 to the warm start), "
    "re-registered on 2026-11-29 before any of the round's runs; the first registration's recipe (one Adam step "
    "an update) learned the cue at H=8 with no arm in 32 or 128 updates. The pilots behind it (single runs, "
    "docs/STUDY_ROUND3.md): MS-GRPO learned the cue at H=8 on seeds 0-3 (following the sign 0.94, 0.93, 0.94 and "
    "0.83 from 0.48-0.51), at H=2 (0.94) and at H=32 (0.50 -> 0.82, seed 0); GAE lambda 0.95 kept the reply "
    "format and learned at H=2 (full critic) and H=8 (full, partial and no critic), lambda 1 at H=8 (full, "
    "partial). When the cue is learned varies between seeds (by update 10-13 on seeds 0 and 2, at update 26 on "
    "seed 1), so the final eval partly reads whether the jump has happened by update 32; the AUC of training "
    "success beside it reads how soon.")

E6_REASON = (
    "not tested: no probe in the project has states that recur within and across sessions at different "
    "turns, a decision that is not degenerate, and a byte-model warm start above 0.3. revisit h4 (3 cells, "
    "`right` optimal everywhere) kept the arms bit-identical for 6-25 updates in round 2; revisit h16 starts "
    "at 0.094 and lost the reply format; babyai GoToLocalS6N2 has recurring anchor states and learned (0.234 "
    "-> 0.422, one seed, docs/tasks.md) but starts below 0.3 and costs ~10x a delayed h8 run a session; "
    "keydoor and frozenlake have anchor states but no measured warm start")

# Issue 41 item 9 (E1 and E5 on TextWorld's coin collector at two quest lengths): not planned yet. The byte
# model learns levels 5 and 10 (0.312 -> 0.641 and 0.078 -> 0.531 in 20 updates of 32 sessions, one seed each,
# docs/tasks.md), but at two Adam steps an update (configs/textworld.py), not the recipe this round is
# registered at (RECIPE), and
# an RL update there costs tens of times delayed's (level 20: ~0.6 min wall against ~1 s at delayed H=8 with one
# step an update, both on the shared 2-core CPU): a later registration at RECIPE, or not at all.
TEXTWORLD_NOTE = ("not planned: the byte model learns coin collector levels 5 and 10 (one seed each, docs/tasks.md), "
                  "at two Adam steps an update, not the recipe this round is registered at, and an update costs "
                  "tens of times delayed's")


# The registered recipe (configs/study.py cell arguments; docs/STUDY_ROUND3.md's recipe pilot): 32 updates of
# 8 tasks x 4 sessions, each update 8 passes of 4 minibatches (32 Adam steps; the second round took one, and
# no arm learned the cue at H=8 with it), lr 2.5e-4, a k3 KL penalty of 0.1 to the warm start (without it
# GAE lost the reply format at 32 steps an update). Every cell of the round runs it, so its names carry it.
RECIPE = {"epochs": 8, "mb": 4, "lr": 2.5e-4, "kl": 0.1, "updates": 32}


def base(h: int) -> dict:
  """The probe at horizon h: delayed with the cue, hidden draws salted by the seed, at the round's RECIPE."""
  return {"probe": "delayed", "horizon": h, "cue": True, "draws": True, **RECIPE}


# The cell arguments that make a probe's env (configs/study.py): what its ceiling is measured with.
ENV_ARGS = ("probe", "horizon", "cue", "draws")


def probes(experiments=None) -> dict[str, dict]:
  """The plan's probes, in the order the cells name them: each policy warm start -> the env arguments its RL
  cells share (ENV_ARGS), the probe table's rows and what their ceilings are read with
  (records.ceiling_record). `experiments`: EXPERIMENTS unless given."""
  out: dict = {}
  for e in EXPERIMENTS if experiments is None else experiments:
    for c in e.cells:
      env = {k: c.full[k] for k in ENV_ARGS}
      if out.setdefault(c.warm, env) != env:  # one warm start's cells on two envs: which ceiling is its?
        raise ValueError(f"{e.id}: `{c.label}` plays {env}, other cells of {c.warm} {out[c.warm]}")
  return out


def label(arm: str, h: int, critic: str = "") -> str:
  return f"{arm} {critic} h{h}" if critic else f"{arm} h{h}"


def critic_state(cell: Cell) -> str:
  """What the cell's critic is at the start of RL: none, partial, full, or '-' (an arm without one)."""
  from experiments.study.plan import CRITIC_ARMS
  full = cell.full
  if full["arm"] not in CRITIC_ARMS:
    return "-"
  return "none" if not full["vp"] else ("partial" if full["vpr"] else "full")


def gae_cell(arm: str, h: int, critic: str) -> Cell:
  return Cell(label(arm, h, critic), {**base(h), "arm": arm, **CRITICS[critic]})


def ms_grpo_cell(h: int) -> Cell:
  return Cell(label("ms_grpo", h), {**base(h), "arm": "ms_grpo"})


def control_label(arm: str, critic: str, q: float, h: int) -> str:
  return label(f"{arm} {critic}".strip() + f" control q={q:g}", h)


CRITIC_FREE_REFS = CONTROL_REFS[:1]  # the experiments without a critic arm (E2, E5)


def graded_cells(h: int, refs=CONTROL_REFS) -> tuple[Cell, ...]:
  """The reference arms' graded controls at horizon h (q in GRADED_Q, decision scope)."""
  return tuple(Cell(control_label(arm, cr, q, h), {**base(h), "arm": arm, **CRITICS.get(cr, {}), "dshuffle": q})
               for arm, cr in refs for q in GRADED_Q)


def graded(horizons, refs=CONTROL_REFS) -> tuple[tuple[str, str, float], ...]:
  """(reference label, control label, q) per horizon, reference arm and q."""
  return tuple((label(arm, h, cr), control_label(arm, cr, q, h), q)
               for h in horizons for arm, cr in refs for q in GRADED_Q)


@dataclasses.dataclass(frozen=True)
class Round3Experiment(Experiment):
  # The graded controls the experiment's verdicts are bounded by: (reference, control, q).
  graded: tuple[tuple[str, str, float], ...] = ()
  # Pre-registered interactions, each its own Holm family: (family, ((a_hi, b_hi, a_lo, b_lo), ...)); a
  # test is the per-seed (a_hi - b_hi) - (a_lo - b_lo), predicted > 0.
  interactions: tuple = ()


def _controls_of(horizons, refs=CONTROL_REFS) -> tuple[tuple[str, str], ...]:
  """Every experiment's binary controls (plan.Experiment.controls): the q=1 control of each reference."""
  return tuple((r, c) for r, c, q in graded(horizons, refs) if q == 1.0)


def _e1() -> Round3Experiment:
  cells = tuple(gae_cell(arm, h, c) for h in HORIZONS for c in CRITICS for arm in LAMBDA_ARMS)
  cells += tuple(ms_grpo_cell(h) for h in HORIZONS)
  cells += tuple(c for h in HORIZONS for c in graded_cells(h))
  comps = tuple((label(a, h, c) if a != "ms_grpo" else label(a, h), label("gae_lambda0.95", h, c))
                for c in ("none", "partial") for h in HORIZONS for a in ("gae_lambda1", "ms_grpo"))
  comps += tuple((label("gae_length_adaptive_alpha2", h, "full"), label("gae_lambda0.95", h, "full"))
                 for h in HORIZONS)
  factors = tuple((label("gae_lambda1", h, "full"), label("gae_lambda0.95", h, "full"),
                   "lambda 1 vs 0.95 under a critic at the bar (theory: 0.95 may win there)") for h in HORIZONS)
  factors += tuple((label("gae_length_adaptive_alpha2", h, c), label("gae_lambda0.95", h, c),
                    f"length-adaptive vs fixed lambda, {c} critic") for h in HORIZONS for c in ("none", "partial"))
  inter = tuple((label("gae_lambda1", hi, "partial"), label("gae_lambda0.95", hi, "partial"),
                 label("gae_lambda1", 2, "partial"), label("gae_lambda0.95", 2, "partial")) for hi in (8, 32))
  return Round3Experiment(
      "E1", "lambda x horizon x critic quality",
      "Does GAE with lambda 0.95 and an imperfect learned critic lose the turn-0 choice as the turns between "
      "it and its payoff grow, where lambda 1 and outcome credit (MS-GRPO) keep it?",
      "Token-level GAE with lambda < 1 and an imperfect learned critic is biased over long horizons; lambda 1 "
      "and outcome-based MS-GRPO are not (VC-PPO, VAPO); length-adaptive lambda beats a fixed 0.95 (VAPO).",
      "VC-PPO (arXiv 2503.01491), VAPO (arXiv 2504.05118), MS-GRPO (arXiv 2508.10839)",
      cells, comps, controls=_controls_of(HORIZONS), factors=factors, graded=graded(HORIZONS),
      interactions=((INTERACTION_FAMILY, inter),),
      note=f"`delayed(cue=True)` at horizons {', '.join(map(str, HORIZONS))}, draws salted by the seed; critic "
           f"none (vp off), partial (value pretraining stopped at {PARTIAL_RATIO} of the oracle's EV), full (the "
           "bar); the claims are tested under the none and partial critics, VAPO's adaptive lambda under the "
           "full one (its setting: a pretrained critic). " + RECIPE_NOTE)


def _e3() -> Round3Experiment:
  cells = tuple(gae_cell("gae_lambda0.95", h, c) for h in HORIZONS for c in CRITICS)
  comps = tuple((label("gae_lambda0.95", h, "full"), label("gae_lambda0.95", h, "none")) for h in HORIZONS)
  factors = tuple((label("gae_lambda0.95", h, "full"), label("gae_lambda0.95", h, "partial"),
                   "a critic at the bar vs a partial one") for h in HORIZONS)
  cells += tuple(ms_grpo_cell(h) for h in HORIZONS) + tuple(c for h in HORIZONS for c in graded_cells(h))
  return Round3Experiment(
      "E3", "Value pretraining",
      "Does fitting the critic on the warm start's returns before RL help PPO, more so when the payoff is far?",
      "Value pretraining removes the early collapse a randomly initialised critic causes and improves PPO's "
      "final result.", "VC-PPO (arXiv 2503.01491) section 3.2; VAPO (arXiv 2504.05118)",
      cells, comps, controls=_controls_of(HORIZONS), factors=factors, graded=graded(HORIZONS),
      note="E1's gae_lambda0.95 cells under the three critics (the same runs)")


def _e4() -> Round3Experiment:
  cells = tuple(c for h in HORIZONS for cr in ("none", "partial") for c in (
      Cell(label("policy 0.95 critic 1.0", h, cr), {**base(h), "arm": "gae_decoupled", **CRITICS[cr]}),
      gae_cell("gae_lambda0.95", h, cr)))
  cells += tuple(c for h in HORIZONS for c in (ms_grpo_cell(h), gae_cell("gae_lambda0.95", h, "full"), *graded_cells(h)))
  comps = tuple((label("policy 0.95 critic 1.0", h, cr), label("gae_lambda0.95", h, cr))
                for h in HORIZONS for cr in ("none", "partial"))
  return Round3Experiment(
      "E4", "Decoupled lambda with a critic still learning",
      "Is a critic fitted with lambda 1 and a policy advantage with lambda 0.95 better than a shared 0.95, "
      "when the critic is still learning during RL?",
      "Decoupled lambda (critic 1.0, policy 0.95) beats a shared lambda of 0.95.",
      "VC-PPO (arXiv 2503.01491) section 3.3",
      cells, comps, controls=_controls_of(HORIZONS), graded=graded(HORIZONS), figure="bars",
      note="critic none and partial only: in round 2 both arms started from one critic fitted to Monte-Carlo "
           "targets, where lambda_critic has nothing left to change (rollouts identical for 32 updates on 7/8 "
           "seeds at h2)")


def _e5() -> Round3Experiment:
  cells = tuple(c for h in E5_HORIZONS for c in (
      Cell(label("trajectory grpo", h), {**base(h), "arm": "grpo"}),
      Cell(label("ms_grpo session", h), {**base(h), "arm": "ms_grpo"}),
      Cell(label("ms_grpo turn history", h), {**base(h), "arm": "ms_grpo", "context": "history"}),
      Cell(label("ms_grpo turn markov", h), {**base(h), "arm": "ms_grpo", "context": "markov"})))
  cells += tuple(c for h in E5_HORIZONS for c in (ms_grpo_cell(h), *graded_cells(h, CRITIC_FREE_REFS)))
  comps = tuple((label(f"ms_grpo turn {ctx}", h), label("trajectory grpo", h))
                for h in E5_HORIZONS for ctx in ("markov", "history"))
  return Round3Experiment(
      "E5", "MS-GRPO per-turn samples vs trajectory GRPO",
      "Does crediting the episode return to every turn as its own sample beat trajectory-level GRPO?",
      "MS-GRPO (per-turn samples, Markov context) trains multi-step agents better than trajectory GRPO.",
      "MS-GRPO (arXiv 2508.10839)",
      cells, comps, controls=_controls_of(E5_HORIZONS, CRITIC_FREE_REFS),
      graded=graded(E5_HORIZONS, CRITIC_FREE_REFS),
      note=f"horizons {', '.join(map(str, E5_HORIZONS))} (H=32 cut for the CPU budget); `ms_grpo session` is "
           "the E1 cell (the same run), the return on every turn in one sample per session")


def _e2() -> Round3Experiment:
  cells = tuple(c for h in E2_HORIZONS for c in (
      ms_grpo_cell(h),  # eta = 0: the synchronous learner, where both objectives coincide
      *(Cell(label(f"{'decoupled' if d else 'naive'} eta={eta}", h),
             {**base(h), "arm": "ms_grpo", "eta": eta, "decoupled": d}) for d in (True, False) for eta in E2_ETAS)))
  cells += tuple(c for h in E2_HORIZONS for c in graded_cells(h, CRITIC_FREE_REFS))
  comps = tuple((label(f"decoupled eta={eta}", h), label(f"naive eta={eta}", h))
                for h in E2_HORIZONS for eta in E2_ETAS)
  return Round3Experiment(
      "E2", "Decoupled vs naive PPO under staleness",
      "Does the decoupled objective (proximal policy = the learner's current one) keep stale data useful?",
      "With staleness eta >= 4, naive PPO degrades while decoupled PPO keeps its final success.",
      "AReaL (arXiv 2505.24298), Table 5 / Fig. 5",
      cells, comps, controls=_controls_of(E2_HORIZONS, CRITIC_FREE_REFS),
      graded=graded(E2_HORIZONS, CRITIC_FREE_REFS), figure="bars",
      note="ms_grpo advantages (critic-free: the queue's staleness acts on the policy only), 2 actors through "
           "the async queue; eta = 0 is the synchronous learner, E1's `ms_grpo` cell (both objectives coincide)")


def _e6() -> Round3Experiment:
  return Round3Experiment(
      "E6", "Step-level credit without a critic",
      "Do step groups on recurring states (GiGPO) or nested history groups (HGPO) credit better than outcome "
      "credit?", "GiGPO beats GRPO (ALFWorld, WebShop); HGPO beats GiGPO.",
      "GiGPO (arXiv 2505.10978), HGPO (arXiv 2602.22817)", (), (), cut=E6_REASON)


EXPERIMENTS = (_e1(), _e2(), _e3(), _e4(), _e5(), _e6())


def experiment(eid: str) -> Round3Experiment:
  for e in EXPERIMENTS:
    if e.id == eid:
      return e
  raise KeyError(f"no experiment {eid!r} in round 3; have {[e.id for e in EXPERIMENTS]}")
