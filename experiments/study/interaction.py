"""Round 3's pre-registered interaction tests (round3.Round3Experiment.interactions), each family its own Holm.

A test (a_hi, b_hi, a_lo, b_lo) is E1's horizon x lambda interaction: per seed, the double difference
d_s = (a_hi_s - b_hi_s) - (a_lo_s - b_lo_s) over the seeds all four cells have, on each of the claims'
metrics (final success and AUC, verdicts.METRICS), predicted > 0. It is stats.paired_test on those d_s
(stats.paired on the two per-seed differences): stats.py's test is two-sided, so the test here is too,
with the sign stated. After Holm over the family's tests x metrics (this family only: the claims' family,
verdicts.study_tests, is a separate one and neither changes the other), a test is

- **reproduced**: d > 0 on some metric (Holm p < stats.ALPHA) and d < 0 on none;
- **not reproduced**: d < 0 on some metric after Holm (the interaction reversed, significantly);
- **inconclusive (MDE x)**: neither; x is the largest of its metrics' MDEs (two-sided paired t at
  stats.ALPHA, power stats.POWER, at this n and this sd of d), so a true interaction of x would have been
  found with probability 0.8 by one test (under Holm, larger ones are needed: x is a lower bound);
- **no difference (identical ...)**: every d_s is 0 on every metric (no MDE of its own, verdicts.identical);
- **not tested (why)**: some cell has no records, or its critic is below the bar (verdicts.untested_because
  on all four cells), or fewer than 2 seeds have all four, or their records' code differs beyond the
  plan's allowed files (versions.CodeCheck).

The words are stats.paired_verdict's with no control: the graded control bounds the claims (graded.py),
not this test, which the plan states without one.
"""
from __future__ import annotations

from experiments.study import stats
from experiments.study.verdicts import METRIC_NAMES, METRICS, identical, untested_because


def double_difference(cs: dict, a_hi: str, b_hi: str, a_lo: str, b_lo: str, metric: str):
  """(seeds all four cells have, sorted; (a_hi - b_hi) - (a_lo - b_lo) at those seeds) on `metric`."""
  def diff(a, b):
    seeds, d = stats.paired(cs[a][metric], cs[b][metric])
    return dict(zip(seeds, d))
  return stats.paired(diff(a_hi, b_hi), diff(a_lo, b_lo))


def name(test: tuple) -> str:
  a_hi, b_hi, a_lo, b_lo = test
  return f"(`{a_hi}` - `{b_hi}`) - (`{a_lo}` - `{b_lo}`)"


def interaction_tests(exps, cstats: dict, code=None) -> list[dict]:
  """Every pre-registered interaction test of `exps` (cstats: experiment id -> verdicts.cell_stats), tested;
  Holm within each family over its tests x metrics. One dict per test: exp, family, cells (a_hi, b_hi,
  a_lo, b_lo), untested (why, or None), critic_note, tests {metric: (seeds, PairedTest or None)}, p_adj,
  judged {metric: "A>B" | "B>A" | "n.s." | "n/a"}, verdict, family_size."""
  out = []
  for exp in exps:
    cs = cstats[exp.id]
    for family, tests in getattr(exp, "interactions", ()):
      mine = []
      for cells in tests:
        why = untested_because(cs, *cells) or (code and code.refusal(
            [r for lab in cells for r in cs[lab]["recs"].values()]))
        got = {}
        for m in () if why else METRICS:
          seeds, d = double_difference(cs, *cells, m)
          got[m] = (seeds, stats.paired_test(d))
        if not why and all(t is None for _, t in got.values()):
          n = max(len(seeds) for seeds, _ in got.values())
          why, got = f"{n} seed{'s' if n != 1 else ''} with records of all four cells: a paired test needs 2", {}
        mine.append({"exp": exp.id, "family": family, "cells": tuple(cells), "untested": why, "tests": got,
                     "critic_note": None if why else untested_because(cs, *cells, uncertain=True)})
      slots = [(i, m) for i, it in enumerate(mine) for m, (_, t) in it["tests"].items() if t is not None]
      for (i, m), p in zip(slots, stats.holm([mine[i]["tests"][m][1].p for i, m in slots])):
        mine[i].setdefault("p_adj", {})[m] = p
      for it in mine:
        it["family_size"] = len(slots)
        it["judged"] = {m: stats.judge(t, it.get("p_adj", {}).get(m)) for m, (_, t) in it["tests"].items()}
        it["verdict"] = verdict(it)
      out += mine
  return out


def verdict(it: dict) -> str:
  """A tested interaction's words (the module's docstring), with its critic-uncertain note if any."""
  if it["untested"]:
    return f"not tested ({it['untested']})"
  if identical(it):
    n = max(t.n for _, t in it["tests"].values() if t is not None)
    return f"no difference (identical on all {n} seeds: every double difference is 0)"
  mdes = [t.mde for _, t in it["tests"].values() if t is not None and not (t.mean == 0 and t.sd == 0)]
  words = stats.paired_verdict([tuple(it["judged"].values())], [mdes], None)
  return words + (f" (critic uncertain: {it['critic_note']})" if it.get("critic_note") else "")


def key_number(it: dict) -> str:
  """The headline's number: the mean double difference on the metric that decided it, else ""."""
  side = {"reproduced": "A>B", "not reproduced": "B>A"}.get(it["verdict"].split(" (")[0])
  m = next((m for m in METRICS if side and it["judged"].get(m) == side), None)
  return f"{METRIC_NAMES[m]} {it['tests'][m][1].mean:+.3f}" if m else ""


def line(it: dict) -> str:
  """'<family>: (A_hi - B_hi) - (A_lo - B_lo) > 0: <verdict>[ (<metric> <mean>)]'."""
  key = key_number(it)
  return f"{it['family']}: {name(it['cells'])} > 0: {it['verdict']}" + (f" ({key})" if key else "")


JUDGED = {"A>B": "> 0", "B>A": "< 0"}  # stats.judge's words, said of the double difference


def _p(p: float) -> str:
  return "<0.001" if p < 0.001 else f"{p:.3f}"


HEADER = ["test (predicted > 0)", "metric", "seeds", "mean double difference [95% t interval]", "dz", "p (two-sided)",
          "Holm p (this family)", "MDE (power 0.8)", "judged"]


def rows(items: list[dict]) -> list[list]:
  """The table's rows: one per test and metric (one for an untested test)."""
  out = []
  for it in items:
    if it["untested"]:
      out.append([name(it["cells"]), "—", "—", f"not tested ({it['untested']})", "", "", "", "", ""])
      continue
    for m, (seeds, t) in it["tests"].items():
      if t is None:
        out.append([name(it["cells"]), METRIC_NAMES[m], len(seeds), "no test (fewer than 2 seeds)", "", "", "", "", "n/a"])
        continue
      p_adj = it.get("p_adj", {}).get(m)
      out.append([name(it["cells"]), METRIC_NAMES[m], len(seeds), f"{t.mean:+.3f} [{t.lo:+.3f}, {t.hi:+.3f}]",
                  f"{t.dz:.2f}", _p(t.p), "—" if p_adj is None else _p(p_adj), f"{t.mde:.3f}",
                  JUDGED.get(it["judged"][m], it["judged"][m])])
  return out
