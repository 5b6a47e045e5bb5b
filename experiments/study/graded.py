"""The third round's graded positive control, and what it lets a claim's "no difference" say (issue 41).

  python -m experiments.study.graded [--records docs/study3] [--out FILE]   # the graded part, from records

On each probe (delayed(cue) at one horizon) each reference arm of round3.CONTROL_REFS has controls with the
decision turn's credit shuffled on a fraction q of the sessions (round3.GRADED_Q). Each control is tested
against its reference with the study's paired test (verdicts.paired_tests: per-seed reference - control,
the claims' metrics, final success and AUC), and separates at the level of the study's binary control
(stats.separates: the reference ahead, unadjusted p < stats.ALPHA). On each metric, the *smallest control
effect the design detected* on that probe and reference is the smallest observed mean loss among the
q-controls that separated on that metric; "none detected" when none did.

The rule for the claims (issue 41 item 2). A claim that is neither reproduced nor reversed after Holm may read
"no difference larger than x" (x its MDE) only when, on every metric it has an MDE on, its MDE there is at
or above the smallest detected control effect there, for every reference that judges it (`references`
below); x is then its largest MDE. It reads "not yet testable" while some reference R that judges it has
fewer than 2 seeds paired in every control of its probe (no paired test exists yet: an interim state, never
at the registered seeds), "underpowered (no graded control of R separated on this probe)" when some
reference R had no control separate on its probe (on any metric), else
"inconclusive (MDE ...; the design's smallest detected control effect on this probe is ...)" naming the
metric where it fell short. Reproduced, not reproduced, not
tested and identical claims keep the words verdicts.py gives them.

What the control is not yet (docs/STUDY_ROUND3.md's pilot): it draws only sessions whose decision reply
was valid, so the decision turn's format credit stays; but in 4 of the pilot's 18 control runs the relay
turn's format still collapsed (75-100% of relay replies invalid), so on some seeds it removes more than the
decision's credit; a bound drawn from it inherits that.

The command's last line is one JSON object: the record folder, the experiments with records, and per
probe and reference the smallest detected control effect on each metric (null: none detected).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import NamedTuple

from experiments.study import records as records_mod
from experiments.study import kinds, round3, stats
from experiments.study.plan import CRITIC_ARMS
from experiments.study.tables import _table
from experiments.study.verdicts import (METRIC_NAMES, METRICS, cell_stats, comparison_verdict, critic_notes,
                                        identical, paired_tests, study_tests, untested_because)

# ------------------------------------------------------------------ which controls judge a claim

# The mapping, in one place: an arm of the GAE family (an arm with a critic: plan.CRITIC_ARMS) is judged by
# the controls of GAE(0.95) with the full critic, whatever its own critic's state; every other arm by
# MS-GRPO's. A claim between a GAE-family arm and a critic-free one (E1's ms_grpo vs gae_lambda0.95) is
# judged by both references: it may read "no difference larger than x" only when both back x.
GAE_REFERENCE, CRITIC_FREE_REFERENCE = round3.CONTROL_REFS[1], round3.CONTROL_REFS[0]


def reference_of(cell) -> tuple[str, str]:
  """(arm, critic) of the reference whose graded controls judge a claim side `cell` (round3.CONTROL_REFS)."""
  return GAE_REFERENCE if cell.full["arm"] in CRITIC_ARMS else CRITIC_FREE_REFERENCE


def references(exp, a: str, b: str) -> tuple[tuple[str, str], ...]:
  """The references judging the claim `a` > `b`: each side's (reference_of), once each, in CONTROL_REFS order."""
  mine = {reference_of(exp.cell(a)), reference_of(exp.cell(b))}
  return tuple(r for r in round3.CONTROL_REFS if r in mine)


def critic_words(cell) -> str:
  """A claim side's critic as round3's plan labels it: none (vp off), partial, full, or a critic-free arm."""
  state = round3.critic_state(cell)
  return "critic-free" if state == "-" else f"critic {state}"


def ref_name(ref: tuple[str, str]) -> str:
  arm, critic = ref
  return f"{arm} ({critic} critic)" if critic else arm


# ------------------------------------------------------------------ the ladders


class Rung(NamedTuple):
  """One graded control against its reference: tests[m] = (seeds, PairedTest of reference - control)."""
  q: float
  ref: str
  control: str
  untested: str | None
  tests: dict
  separates: dict  # metric -> bool


class Ladder(NamedTuple):
  """A reference arm's graded controls on one probe (its policy warm start: probe, horizon, cue)."""
  probe: str
  horizon: int
  ref: tuple[str, str]  # (arm, critic) as in round3.CONTROL_REFS
  ref_label: str
  rungs: tuple[Rung, ...]

  def smallest(self, metric: str) -> Rung | None:
    """The rung with the smallest observed mean loss among those that separated on `metric`; None: none did."""
    hits = [r for r in self.rungs if r.separates.get(metric)]
    return min(hits, key=lambda r: r.tests[metric][1].mean) if hits else None

  def detected(self) -> bool:
    return any(self.smallest(m) for m in METRICS)

  def most_paired(self) -> int:
    """The most seeds any tested rung pairs with its reference on any metric (0: no rung could be tested).
    Below 2 no rung has a paired test, so "nothing separated" would say nothing of the design's power."""
    return max((len(seeds) for r in self.rungs if not r.untested for seeds, _ in r.tests.values()), default=0)


def _ref_key(cell) -> tuple[str, str]:
  state = round3.critic_state(cell)
  return (cell.full["arm"], "" if state == "-" else state)


def ladders(exp, cs: dict, code=None) -> dict:
  """(probe, (arm, critic)) -> Ladder for each reference and probe of the experiment's graded controls."""
  out: dict = {}
  for ref, control, q in exp.graded:
    cell = exp.cell(ref)
    why = untested_because(cs, ref, control) or (code and code.refusal([*cs[ref]["recs"].values(),
                                                                       *cs[control]["recs"].values()]))
    tests = {} if why else paired_tests(cs, ref, control)
    rung = Rung(q, ref, control, why, tests, {m: stats.separates(t) for m, (_, t) in tests.items()})
    key = (cell.warm, _ref_key(cell))
    old = out.get(key)
    out[key] = Ladder(cell.warm, cell.full["horizon"], key[1], ref, (old.rungs if old else ()) + (rung,))
  return {k: v._replace(rungs=tuple(sorted(v.rungs, key=lambda r: -r.q))) for k, v in out.items()}


def study_ladders(exps, cstats: dict, code=None) -> dict:
  """Every experiment's ladders, once each (experiments share their control cells: the same runs)."""
  out: dict = {}
  for exp in exps:
    for k, v in ladders(exp, cstats[exp.id], code).items():
      out.setdefault(k, v)
  return out


# ------------------------------------------------------------------ the rule for the claims


def claim_mdes(it: dict) -> dict:
  """metric -> the claim's MDE, leaving out a metric whose paired differences are all 0 (no MDE of its own)."""
  return {m: t.mde for m, (_, t) in it["tests"].items() if t is not None and not (t.mean == 0 and t.sd == 0)}


def _eff(rung: Rung, metric: str) -> str:
  return f"{rung.tests[metric][1].mean:.3f} at q={rung.q:g}"


def bound_words(exp, it: dict, lad: dict) -> str:
  """The words of an unresolved claim (neither A>B nor B>A on any metric) under the graded rule."""
  cell = exp.cell(it["a"])
  refs = references(exp, it["a"], it["b"])
  mdes = {m: x for m, x in claim_mdes(it).items() if x is not None and x == x and x != float("inf")}
  got = {ref: lad.get((cell.warm, ref)) for ref in refs}
  for ref, g in got.items():  # a reference with too few paired seeds has not been tried yet: say so first
    if g is not None and not g.detected() and (n := g.most_paired()) < 2:
      return (f"not yet testable (the graded controls of {ref_name(ref)} have {n} paired "
              f"seed{'' if n == 1 else 's'} on this probe: a paired test needs 2)")
  for ref, g in got.items():  # a reference whose controls saw nothing leaves the claim unbacked at any size
    if g is None or not g.detected():
      return (f"underpowered (no graded control of {ref_name(ref)} "
              f"{'ran' if g is None else 'separated'} on this probe)")
  if not mdes:
    return "inconclusive (MDE unknown)"
  top = max(mdes.values())
  worst = None  # (ref, metric, rung) of the largest smallest-detected effect: what x must reach
  for ref, g in got.items():
    for m, x in mdes.items():
      rung = g.smallest(m)
      if rung is None:
        return (f"inconclusive (MDE {top:.3f}; no graded control of {ref_name(ref)} separated on "
                f"{METRIC_NAMES[m]} on this probe)")
      if x < rung.tests[m][1].mean:
        return (f"inconclusive (MDE {x:.3f} on {METRIC_NAMES[m]}; the design's smallest detected control "
                f"effect on this probe is {_eff(rung, m)}, {ref_name(ref)})")
      if worst is None or rung.tests[m][1].mean > worst[2].tests[worst[1]][1].mean:
        worst = (ref, m, rung)
  ref, m, rung = worst
  return (f"no difference larger than {top:.3f} (its MDE; the design's smallest detected control effect on "
          f"this probe is {_eff(rung, m)} on {METRIC_NAMES[m]}, {ref_name(ref)})")


def claim_verdict(exp, it: dict, items: list, lad: dict) -> str:
  """A claim's words: verdicts.py's where it is untested, identical, reproduced or reversed; the graded rule
  (bound_words) where it is unresolved. Its critic notes (uncertain at the bar, a partial critic's band), if
  any, stay."""
  if it["untested"] or identical(it):
    return comparison_verdict(exp, it, items)
  judged = tuple(it["judged"].values())
  if "B>A" in judged or "A>B" in judged:
    return comparison_verdict(exp, it, items)
  return bound_words(exp, it, lad) + critic_notes(it)


def claim_line(exp, it: dict, items: list, lad: dict) -> str:
  """One verdict line: the experiment, the claim (A > B) with each side's critic state, and its words."""
  a, b = exp.cell(it["a"]), exp.cell(it["b"])
  return (f"{exp.id}: `{it['a']}` ({critic_words(a)}) > `{it['b']}` ({critic_words(b)}): "
          + claim_verdict(exp, it, items, lad))


def experiment_word(verdicts: list[str]) -> str:
  """An experiment's word over its claims' words: not reproduced if one is, reproduced if all tested ones
  are; else the unresolved ones decide: underpowered if one is, else inconclusive if one is, else no
  difference larger than the largest x among them."""
  tested = [v for v in verdicts if not v.startswith(("not tested", "not yet testable"))]
  if not tested:  # "not yet testable" (too few paired seeds so far) is not a verdict on the design
    return "not yet testable" if any(v.startswith("not yet testable") for v in verdicts) else "not tested"
  if any(v.startswith("not reproduced") for v in tested):
    return "not reproduced"
  if all(v.startswith("reproduced") for v in tested):
    return "reproduced"
  open_ = [v for v in tested if not v.startswith("reproduced")]
  for w in ("underpowered", "inconclusive"):
    if any(v.startswith(w) for v in open_):
      return w
  xs = [float(v.split()[4]) for v in open_ if v.startswith("no difference larger than")]
  return f"no difference larger than {max(xs):.3f}" if xs else "no difference (identical on every seed)"


# ------------------------------------------------------------------ layout


def _row(r: Rung, m: str) -> list:
  seeds, t = r.tests[m]
  if t is None:
    return [f"{r.q:g}", f"`{r.control}`", METRIC_NAMES[m], len(seeds), "—", "—", "—", "no test"]
  return [f"{r.q:g}", f"`{r.control}`", METRIC_NAMES[m], len(seeds), f"{t.mean:+.3f} [{t.lo:+.3f}, {t.hi:+.3f}]",
          "<0.001" if t.p < 0.001 else f"{t.p:.3f}", f"{t.mde:.3f}", "separates" if r.separates[m] else "does not separate"]


LADDER_HEADER = ["q", "control", "metric", "seeds paired", "mean loss (reference - control) [95% t interval]",
                 "p (unadjusted)", "MDE (power 0.8)", f"at p < {stats.ALPHA}"]


def smallest_line(ladder: Ladder) -> str:
  """'Smallest control effect the design detected on <probe> (<reference>): final 0.100 at q=0.5, AUC ...'."""
  said = [f"{METRIC_NAMES[m]} " + (_eff(r, m) if (r := ladder.smallest(m)) else "none detected") for m in METRICS]
  return (f"Smallest control effect the design detected on delayed(cue) H={ladder.horizon} "
          f"({ref_name(ladder.ref)}, `{ladder.ref_label}`): " + ("; ".join(said) if ladder.detected()
                                                                 else "none detected"))


def ladder_table(ladder: Ladder) -> str:
  rows = [[f"{r.q:g}", f"`{r.control}`", "—", "—", f"not tested ({r.untested})", "", "", ""] if r.untested
          else _row(r, m) for r in ladder.rungs for m in (METRICS if not r.untested else METRICS[:1])]
  return smallest_line(ladder) + ".\n\n" + _table(LADDER_HEADER, rows)


def section(exps, cstats: dict, items: list, lad: dict) -> str:
  """The graded part of the report: each probe's ladders, then each experiment's claims under the rule."""
  mapping = (f"Which controls judge a claim: a GAE-family arm (an arm with a critic) is judged by "
             f"{ref_name(GAE_REFERENCE)}'s controls whatever its own critic, every other arm by "
             f"{ref_name(CRITIC_FREE_REFERENCE)}'s; a claim between the two kinds by both (it is bounded only "
             "where both back its MDE), always on the claim's own probe.")
  parts = ["## The graded positive control", "", mapping, ""]
  for key in sorted(lad, key=lambda k: (lad[k].horizon, round3.CONTROL_REFS.index(k[1]))):
    parts += [ladder_table(lad[key]), ""]
  for exp in exps:
    mine = [i for i in items if i["exp"] == exp.id and i["kind"] == "claim"]
    if not mine:
      continue
    lines = [claim_line(exp, i, items, lad) for i in mine]
    word = experiment_word([claim_verdict(exp, i, items, lad) for i in mine])
    parts += [f"**{exp.id}: {word}** ({exp.title}). Claim: {exp.claim}", "", *(f"- {ln}" for ln in lines), ""]
  return "\n".join(parts).rstrip() + "\n"


def _graded(records_dir: str, experiments=None, code=None):
  """The experiments with records, their cell numbers, tested items and ladders."""
  exps = round3.EXPERIMENTS if experiments is None else experiments
  dirs = kinds.pooled_dirs(records_dir)  # round 3's amendment 1: every machine kind's seeds, as report3 reads them
  got = kinds.load_all(dirs=dirs)
  cstats = {e.id: cell_stats(e, got["runs"], got["critics"], got["kinds"] if dirs[1:] else None) for e in exps}
  ran = [e for e in exps if not e.cut and any(s["recs"] for s in cstats[e.id].values())]
  items = study_tests(ran, cstats, code)["items"]
  return ran, cstats, items, study_ladders(ran, cstats, code)


def graded_report(records_dir: str, experiments=None, code=None) -> str:
  """The graded part from the records in `records_dir` (round 3's by default): ladders and claim lines."""
  return section(*_graded(records_dir, experiments, code))


def summary(records_dir: str, experiments=None, code=None) -> dict:
  """The command's JSON line: per ladder ("<probe cell> <arm>[ <critic>]") the smallest detected effect on
  each metric (null: no control separated), or "not tested" where none of its controls could be tested."""
  ran, _, _, lad = _graded(records_dir, experiments, code)
  return {"records": records_dir, "experiments": [e.id for e in ran], "smallest_detected": smallest_detected(lad)}


def smallest_detected(lad: dict) -> dict:
  """Per ladder ("<probe cell> <arm>[ <critic>]") the smallest detected effect on each metric (null: no
  control separated), or "not tested" where none of its controls could be tested."""
  smallest = {}
  for ladder in lad.values():
    key = f"{ladder.probe} {' '.join(x for x in ladder.ref if x)}"
    if all(r.untested for r in ladder.rungs):
      smallest[key] = "not tested"
      continue
    rungs = {m: ladder.smallest(m) for m in METRICS}
    smallest[key] = {m: (None if r is None else round(float(r.tests[m][1].mean), 6)) for m, r in rungs.items()}
  return smallest


def main(argv=None) -> str:
  p = argparse.ArgumentParser(prog="python -m experiments.study.graded", description=__doc__.split("\n\n")[0])
  p.add_argument("--records", default=records_mod.ROUND3_RECORDS, help="the record folder (default docs/study3, pooled with every other machine kind's folder: amendment 1)")
  p.add_argument("--out", default="", help="write the markdown here too")
  a = p.parse_args(argv)
  if not os.path.isdir(a.records):
    p.error(f"--records {a.records} is not a folder (round 3's records land in docs/study3/ as its runs finish)")
  from experiments.study.versions import CodeCheck
  code = CodeCheck(round3.CODE_MAY_DIFFER, cache=os.path.join(a.records, "code_diffs.json"), where=round3.WHERE)
  text = graded_report(a.records, code=code)
  if a.out:
    with open(a.out, "w") as f:
      f.write(text)
  print(text, end="")
  print(json.dumps(summary(a.records, code=code)))
  return text


if __name__ == "__main__":
  main()
