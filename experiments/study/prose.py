"""The report's fixed text: the header, what the statistics and the setup are, the old verdicts, the cost.

Words only (the numbers in them are the plan's and stats.py's constants); report.py puts them
around the tables.
"""
from __future__ import annotations

from experiments.study import stats
from experiments.study.plan import CONFIG, SEEDS
from experiments.study.tables import _table

AUC_DEF = ("AUC = area under rollout success vs `tokens_seen` (trapezoid over the RL steps) divided by "
           "the token span: the token-weighted mean training success, higher = learns sooner per token.")
# The study run of 2026-11-26/27 whose per-run data was not kept (its root, /tmp/st21, is gone).
LOST = ("acf1d62", "/tmp/st21")


STATS = f"""**Statistics.** The design is paired: at one seed every arm starts from the same warm start, trains on
the same task seeds and is evaluated on the same 256 held-out tasks with the same eval keys. A claim "A beats
B" is judged on the per-seed differences d = A - B (final success and AUC): their mean, a Student t 95%
interval on it (its coverage at n = 8 was checked by simulation on a normal null: 95% +- 1.5 points; the
per-arm percentile bootstrap this file used before covers about 88% there, tests/experiments/test_stats.py),
the two-sided paired t p-value, the effect size dz = mean(d) / sd(d), and the minimum detectable effect (MDE:
the true mean difference a paired t test at this n and this sd of d detects with power 0.8 at alpha 0.05).
The p-values of every claim and factor contrast of the study, both metrics, form one Holm family (alpha
{stats.ALPHA}). A claim is **reproduced** when A > B on some metric after Holm and B > A on none; **not
reproduced** when B > A on some metric after Holm; **underpowered** when neither and its positive control
(the one at its own probe and horizon) did not separate (unadjusted p < {stats.ALPHA}, A > B on some metric):
the design could not see a difference known to exist; **inconclusive (MDE x)** when neither and the control
separated: a true difference of x would have been found with probability 0.8 by one paired t test at alpha
0.05 (under Holm's correction the family's tests need larger differences, so x is a lower bound); **not
tested** when a side has no records or its critic is below the bar. An experiment is not reproduced when one
of its claims is, reproduced when all are; otherwise its unresolved claims decide: underpowered when the
control of one of them did not separate, else inconclusive with the largest MDE among them (a reproduced
claim says nothing of what the design can see). The headline lists each claim's verdicts by horizon, each
with its key number: the paired mean difference A - B on the metric that decided it, or the MDE. The
per-cell intervals in the tables are t intervals of the mean over seeds: descriptive, not the test."""

PROTOCOL = """**Setup, and what was tuned.** Every RL cell: the 2-layer d=64 byte model, 32 updates of 8 tasks x 4
sessions, one minibatch, PPO clip 0.2 / 0.28, sampled at temperature 1, from its probe's warm start (600 steps
of behaviour cloning on 1000 quality-0.5 demos), a format penalty of 0.1 per invalid reply in RL, eval at the
warm start and after the last update on 256 held-out tasks. One learning rate for every arm, rl.lr = 5e-4,
chosen on bifurcation h8 pilots (seeds 100 and 101, not study seeds) before the probes below existed; it was
not re-tuned for them. The probes draw the noise and the payoffs the agent cannot see per session (issue 32):
sessions of one group share the task, not the draws, so no group baseline cancels the noise between an early
choice and its payoff. `delayed` (E1, E3, E4) pays turn 0's choice (`left`: cost 0.1, pays 1 w.p. 0.95;
`right`: free, pays w.p. 0.3) at the last of H turns, through +-0.1 per-session noise on each copy turn between;
`revisit` (E6) is a slippery corridor of H // 2 + 1 cells whose cells recur, so GiGPO's step groups differ
from episode groups (docs/probes.md). The critic arms share one critic recipe: a separate trunk initialised
from the policy (critic lr 1e-3) and, with value pretraining on, the probe's one pretrained critic (Monte-Carlo
targets of the warm start's sessions). Normalisation is a factor of its own: grpo / ms_grpo divide the
group-centred return by the group std, dr_grpo (Dr. GRPO) and gigpo do not, gigpo_std does. Every
experiment's positive control is ms_grpo against the same arm with its advantages permuted over the batch's
action tokens each update (rl.shuffle_advantages: the same values, their pairing with the tokens broken), at
the comparison's own probe and horizon."""


# The 2026-11-27 study's verdicts (commit acf1d62, docs/STUDY.md there; no per-run data kept), and what the
# new design says about each: why it could not test its claim on bifurcation / memory.
OLD_VERDICTS = (
    ("E1", "not reproduced (1 reversal: ms_grpo < gae)",
     "not testable on bifurcation h8: ~26 action tokens, and the noise and payoff draw were common to every "
     "session of a group, so the horizon was irrelevant to every group estimator; the reversal tracked std "
     "normalisation, which no arm isolated. Re-run on `delayed` at H = 2, 8, 32 with Dr. GRPO (E1 below)"),
    ("E1m", "not tested (cut)", "memory h8 stayed at its warm start on every arm; dropped (its CRN makes the "
     "horizon irrelevant too)"),
    ("E2", "not run", "cut again this round (not a credit-assignment question)"),
    ("E3", "reproduced", "not testable as run: its critic read EV 0.79 x the oracle's on a 20-round readout whose "
     "oracle EV swung 0.10-0.54, below the 0.8 bar; re-run on `delayed` with the readout's interval (E3 below)"),
    ("E4", "inconclusive", "not testable on bifurcation: lambda 0.95 and 1 tie by construction there (0.816 on "
     "every seed): the critic knows the arm's value at the first TD step. Re-run on `delayed` (E4 below)"),
    ("E5", "not tested (cut)", "cut again this round"),
    ("E6", "inconclusive (2 of 8 won)", "not testable as run: its wins split by normalisation (std vs mean-only), "
     "not credit structure, and did not survive a multiplicity correction. Re-run on `revisit` with the 2 x 2 of "
     "normalisation x credit structure (E6 below)"),
)


def old_verdicts() -> str:
  return ("The study run of 2026-11-27 (commit acf1d62) published the verdicts below from bifurcation and memory. "
          "It kept no per-run data, so they cannot be recomputed; the new design shows why none of them tested "
          "its claim:\n\n" + _table(["experiment", "2026-11-27 verdict", "now"], [list(r) for r in OLD_VERDICTS]))


def cost(got: dict) -> str:
  """The study's CPU cost from the records' wall times (process wall seconds; runs overlapped on the cores)."""
  hours = {k: sum((r.get("wall_s") or 0) for r in got[k].values()) / 3600 for k in ("runs", "critics", "warm")}
  timed = {k: sum(1 for r in got[k].values() if r.get("wall_s")) for k in ("runs", "critics", "warm")}
  return (f"Cost (the records' wall times): {timed['runs']} runs {hours['runs']:.2f} h, {timed['critics']} critic warm "
          f"starts {hours['critics']:.2f} h, {timed['warm']} timed policy warm starts {hours['warm']:.2f} h: "
          f"{sum(hours.values()):.2f} process-hours, several processes at a time on the 2-core CPU (so wall times "
          "include waiting for a core).")


def header(n_runs: int, n_missing: int, date: str, records_dir: str) -> str:
  return f"""# The credit-assignment study

The experiments re-test published claims about credit assignment in multi-turn RL of LM agents (how GAE's
lambda credits an early decisive turn as the horizon grows, value pretraining, decoupled lambdas, step-level
credit without a critic, and how much of each difference is advantage normalisation) on small probe tasks
whose horizon matters to every estimator. Each cell is one `{CONFIG}` argument set, run over seeds
{', '.join(map(str, SEEDS))} from its probe's shared warm start, so cells differ only in what RL does.
Final success = the final eval stage (256 held-out tasks). {AUC_DEF}

{STATS}

{PROTOCOL}

**Data.** This file is generated from the per-run records in `{records_dir}` alone
(`python -m experiments.study.report`; schema in experiments/study/records.py). The study run reported at commit
{LOST[0]} (root {LOST[1]}, 160 runs) kept no per-run data: its tables and verdicts (that file's history)
cannot be recomputed; they compared per-arm percentile-bootstrap intervals by overlap, without the pairing,
the positive controls or a multiplicity correction. The last section says what each of them could not test.

Generated: {date}
Runs: {n_runs} recorded, {n_missing} missing (of the plan: every cell x seed).

Reproduce (CPU, resumable; each finished run writes its record under docs/study/):
```bash
python -m experiments.study --root ROOT --parallel 2 --probes
python -m experiments.study.report
```"""
