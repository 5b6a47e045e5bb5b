"""docs/STUDY.md and its figures from the study's per-run records in docs/study/ (and nothing else).

  python experiments/report.py [--records docs/study] [--out docs/STUDY.md] [--figdir docs/study]

Reads the records experiments/study.py writes as each job finishes
(experiments/records.py: runs/<cell>/seed=<s>.json, critics/, warm/, lab/):
the repo alone regenerates the report. The statistics are experiments/stats.py's
(paired per-seed differences, t intervals, Holm, MDE); this file lays out
tables. Prints the markdown path, then (last line) one JSON object with every
verdict. The same records give the same STUDY.md, byte for byte, but for the
date line.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import records as records_mod  # noqa: E402
import stats  # noqa: E402
from study import CONFIG, EXPERIMENTS, PROBES, SEEDS, SMOL_RECORDS, critic_warm, plan, warm_name  # noqa: E402

AUC_DEF = ("AUC = area under rollout success vs `tokens_seen` (trapezoid over the RL steps) divided by "
           "the token span: the token-weighted mean training success, higher = learns sooner per token.")
CRITIC_BAR = 0.8  # a pretrained critic is fit to test a claim when its EV >= this x the oracle's
INVALID_BAR = 0.05  # an arm "lost the action format" when invalid actions exceed this share of turns
METRICS = ("final", "auc")
# The study run of 2026-11-26/27 whose per-run data was not kept (its root, /tmp/st21, is gone).
LOST = ("acf1d62", "/tmp/st21")


class Mean:
  """A cell's mean over seeds with a t interval (descriptive; the claims are judged on paired differences)."""

  def __init__(self, values):
    self.values = [float(v) for v in values]
    self.n = len(self.values)
    self.mean = float(np.mean(self.values)) if self.values else None
    self.lo, self.hi = (stats.t_interval(self.values) if self.n >= 2 and np.std(self.values) > 0
                        else (self.mean, self.mean))


def _ci(e) -> str:
  return "—" if e is None or e.mean is None else f"{e.mean:.3f} [{e.lo:.3f}, {e.hi:.3f}]"


def _num(x, fmt="{:.2f}") -> str:
  return "—" if x is None else fmt.format(x)


def _table(header, rows) -> str:
  return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                   + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


# ------------------------------------------------------------------ per cell


def cell_critic(cell, crit: dict) -> dict | None:
  """The pretrained critic a cell's runs started from (the probe's one critic warm start), or None.

  `bar` judges CRITIC_BAR on the ratio's 95% session-bootstrap interval: "yes" (its lower end >= the
  bar), "no" (its upper end below it) or "uncertain" (it straddles the bar). Over several critic seeds
  the cell's ends are the means of theirs: wider than an interval on the mean ratio, never narrower.
  A record without ends (written before they existed) makes the cell's judgement the point ratio's
  (`interval` False), "yes" or "no".
  """
  names = sorted({cw for s in SEEDS if (cw := critic_warm(cell, s))})
  if not names:
    return None
  got = [crit.get((cell.warm, int(n.rpartition(",critic,seed=")[2]))) for n in names]
  done = [g["readout"] for g in got if g]
  if not done:
    return {"n": 0, "seeds": len(got), "ev": None, "oracle": None, "ratio": None, "fit_seeds": 0, "bar": None,
            "interval": False}
  mean = lambda key: float(np.mean([g[key] for g in done]))  # noqa: E731
  ev, oracle = mean("explained_variance"), mean("oracle_explained_variance")
  ratios = [g["explained_variance"] / g["oracle_explained_variance"] for g in done if g["oracle_explained_variance"]]
  ratio = float(np.mean(ratios)) if ratios else None
  ends = ("explained_variance", "oracle_explained_variance", "ev_over_oracle")
  interval = all(g.get(f"{k}_{e}") is not None for g in done for k in ends for e in ("lo", "hi"))
  out = {"n": len(done), "seeds": len(got), "ev": ev, "oracle": oracle, "ratio": ratio, "interval": interval}
  if interval:
    for k, short in zip(ends, ("ev", "oracle", "ratio")):
      out[f"{short}_lo"], out[f"{short}_hi"] = mean(f"{k}_lo"), mean(f"{k}_hi")
    out["sessions"] = min(int(g.get("readout_sessions") or 0) for g in done)
    lo, hi = out["ratio_lo"], out["ratio_hi"]
    out["bar"] = "yes" if lo >= CRITIC_BAR else "no" if hi < CRITIC_BAR else "uncertain"
    out["fit_seeds"] = sum(g["ev_over_oracle_lo"] >= CRITIC_BAR for g in done)
  else:
    out["bar"] = None if ratio is None else "yes" if ratio >= CRITIC_BAR else "no"
    out["fit_seeds"] = sum(r >= CRITIC_BAR for r in ratios)
  return out


def cell_stats(exp, runs: dict, crit: dict) -> dict:
  """label -> the cell's records by seed, missing seeds, per-seed metrics and descriptive means."""
  out = {}
  for cell in exp.cells:
    recs = {s: runs[(cell.name, s)] for s in exp.seeds if (cell.name, s) in runs}
    by = {"final": {s: r["final"]["success"] for s, r in recs.items()},
          "auc": {s: r["auc"] for s, r in recs.items() if r.get("auc") is not None}}
    out[cell.label] = {
        "cell": cell, "recs": recs, "missing": [f"{cell.name},seed={s}" for s in exp.seeds if s not in recs],
        **by, "final_est": Mean(by["final"].values()), "auc_est": Mean(by["auc"].values()),
        "invalid_max": [r["invalid_share"]["max"] for r in recs.values() if r.get("invalid_share")],
        "tokens": [r["rollout"]["tokens"][-1] for r in recs.values() if r["rollout"]["tokens"]],
        "wall": [r["wall_s"] for r in recs.values() if r.get("wall_s")],
        "staleness": [r["staleness"] for r in recs.values() if r.get("staleness") is not None],
        "critic": cell_critic(cell, crit),
        "critic_rl": {k: [r["critic"][k] for r in recs.values() if k in (r.get("critic") or {})]
                      for k in ("explained_variance", "oracle_explained_variance")}}
  return out


def untested_because(cs: dict, *labels, uncertain: bool = False) -> str | None:
  """Why a comparison cannot test its claim: a side without runs, a pretrained critic below the bar, or None.

  Below the bar: the ratio's interval wholly below CRITIC_BAR (cell_critic), or, for records without
  an interval, the point ratio below it (said so). A critic whose interval straddles the bar leaves
  the comparison tested; `uncertain=True` returns the sentence that says so (None when no critic
  straddles it), for the verdict line.
  """
  def ratio_said(c):
    if not c["interval"]:
      return f"{c['ratio']:.2f} x the oracle's {c['oracle']:.2f} (point ratio: the record has no interval)"
    return (f"{c['ratio']:.2f} [95% {c['ratio_lo']:.2f}, {c['ratio_hi']:.2f}] x the oracle's "
            f"{c['oracle']:.2f}")

  critics = [(lab, c) for lab in labels if (c := cs[lab]["critic"])]
  if uncertain:
    said = [f"`{lab}`'s critic EV {c['ev']:.2f} = {ratio_said(c)}" for lab, c in critics if c["bar"] == "uncertain"]
    return ("; ".join(said) + f": the ratio's interval straddles the bar ({CRITIC_BAR}), so the critic may be "
            "below it") if said else None
  unrun = [lab for lab in labels if not cs[lab]["recs"]]
  if unrun:
    return "no records of " + " and ".join(f"`{lab}`" for lab in unrun)
  weak = [f"`{lab}`'s critic EV {c['ev']:.2f} = {ratio_said(c)}" for lab, c in critics
          if c["bar"] == "no" and c["ratio"] is not None]
  missing = [f"`{lab}` has no critic record" for lab, c in critics if c["n"] == 0]
  why = weak + missing
  return "; ".join(why) + f" (bar: {CRITIC_BAR} x the oracle's EV before RL)" if why else None


# ------------------------------------------------------------------ tests and verdicts


def paired_tests(cs: dict, a: str, b: str) -> dict:
  """metric -> (seeds, PairedTest or None) for "a beats b" over the seeds both cells have."""
  out = {}
  for m in METRICS:
    seeds, d = stats.paired(cs[a][m], cs[b][m])
    out[m] = (seeds, stats.paired_test(d))
  return out


def study_tests(exps: list, cstats: dict) -> dict:
  """Every claim, factor contrast and control of the study, tested; Holm over the claims' and the
  factors' tests (both metrics) of the whole study; controls unadjusted (a check of the design)."""
  items = []
  for exp in exps:
    cs = cstats[exp.id]
    for kind, pairs in (("claim", [(a, b, None) for a, b in exp.comparisons]), ("factor", exp.factors),
                        ("control", [(a, b, None) for a, b in exp.controls])):
      for a, b, what in pairs:
        why = untested_because(cs, a, b)
        items.append({"exp": exp.id, "kind": kind, "a": a, "b": b, "factor": what, "untested": why,
                      "critic_note": None if why else untested_because(cs, a, b, uncertain=True),
                      "tests": {} if why else paired_tests(cs, a, b)})
  family = [(i, m) for i, it in enumerate(items) if it["kind"] != "control"
            for m, (_, t) in it["tests"].items() if t is not None]
  adj = stats.holm([items[i]["tests"][m][1].p for i, m in family])
  for (i, m), p in zip(family, adj):
    items[i].setdefault("p_adj", {})[m] = p
  for it in items:
    it["judged"] = {m: stats.judge(t, it.get("p_adj", {}).get(m)) for m, (_, t) in it["tests"].items()}
    if it["kind"] == "control":
      it["separates"] = any(stats.separates(t) for _, t in it["tests"].values())
  return {"items": items, "family": len(family)}


def control_ok(exp, items: list, label: str) -> bool | None:
  """Did the positive control powering a comparison of `label` separate? None: no control ran."""
  ctl = exp.control_for(label)
  it = next((i for i in items if i["exp"] == exp.id and i["kind"] == "control" and ctl and (i["a"], i["b"]) == ctl),
            None)
  return None if it is None or it["untested"] else it["separates"]


def _zero(t) -> bool:
  """A metric whose paired differences are exactly 0 on every seed (its sd, so its MDE, is 0 by degeneracy)."""
  return t.mean == 0 and t.sd == 0


def identical(it: dict) -> bool:
  """Every metric's paired differences are exactly 0 on every seed: the two arms' evals did not differ at all
  (e.g. two critic targets whose policies never flip a sampled eval outcome). Their sd, and so their MDE, is 0
  by degeneracy, not a design that sees everything: such a test gives no MDE of its own."""
  tests = [t for _, t in it["tests"].values() if t is not None]
  return bool(tests) and all(_zero(t) for t in tests)


def comparison_verdict(exp, it: dict, items: list) -> str:
  if it["untested"]:
    return f"not tested ({it['untested']})"
  if identical(it):
    n = max(t.n for _, t in it["tests"].values() if t is not None)
    return f"no difference (identical on all {n} seeds: every paired difference is 0)"
  mdes = [t.mde for _, t in it["tests"].values() if t is not None and not _zero(t)]
  verdict = stats.paired_verdict([tuple(it["judged"].values())], mdes, control_ok(exp, items, it["a"]))
  return verdict + (f" (critic uncertain: {it['critic_note']})" if it.get("critic_note") else "")


def experiment_verdict(exp, items: list) -> str:
  claims = [i for i in items if i["exp"] == exp.id and i["kind"] == "claim"]
  tested = [i for i in claims if not i["untested"]]
  if not tested:
    return "not tested (" + "; ".join(sorted({i["untested"] for i in claims})) + ")" if claims else "not tested"
  oks = [control_ok(exp, items, i["a"]) for i in tested]
  control = False if False in oks else (True if True in oks else None)
  if all(identical(i) for i in tested):
    return "no difference (identical on every seed of every tested claim)"
  mdes = [t.mde for i in tested for _, t in i["tests"].values() if t is not None and not _zero(t)]
  return stats.paired_verdict([tuple(i["judged"].values()) for i in tested], mdes, control)


def _diff(t) -> str:
  return "—" if t is None else f"{t.mean:+.3f} [{t.lo:+.3f}, {t.hi:+.3f}]"


def comparison_rows(items: list) -> list:
  rows = []
  for it in items:
    label = f"{it['a']} > {it['b']}" + (f" ({it['factor']})" if it["factor"] else "")
    if it["untested"]:
      rows.append([label, "—", "not tested", "", "", "", "", "", ""])
      continue
    for m, (seeds, t) in it["tests"].items():
      p_adj = it.get("p_adj", {}).get(m)
      rows.append([label, m, len(seeds), _diff(t), _num(t and t.dz), _num(t and t.p, "{:.3f}"),
                   _num(p_adj, "{:.3f}") if it["kind"] != "control" else "(control: unadjusted)",
                   _num(t and t.mde, "{:.3f}"),
                   it["judged"][m] if it["kind"] != "control" else
                   ("separates" if stats.separates(t) else "does not separate")])
  return rows


TEST_HEADER = ["comparison (A > B)", "metric", "seeds paired", "mean A - B [95% t interval]", "dz", "p",
               "Holm p", "MDE (power 0.8)", "judged"]



# ------------------------------------------------------------------ tables and figures


def grid(exp) -> tuple[list[str], list[int]] | None:
  """(arms, horizons) when every label is '<arm> h<H>' (E1; an arm may lack some horizons), else None."""
  parts = [re.fullmatch(r"(.+) h(\d+)", c.label) for c in exp.cells]
  if not all(parts):
    return None
  hs = sorted({int(m[2]) for m in parts})
  widest = max(hs, key=lambda h: sum(int(m[2]) == h for m in parts))
  arms = list(dict.fromkeys([m[1] for m in parts if int(m[2]) == widest] + [m[1] for m in parts]))
  return arms, hs


def cell_table(exp, cs: dict) -> str:
  stale = any(v for s in cs.values() for v in s["staleness"])  # E2's async cells
  header = ["cell", "n", "final success", "AUC"] + (["staleness (mean)"] if stale else []) + ["tokens / run"]
  rows = [[label, s["final_est"].n, _ci(s["final_est"]), _ci(s["auc_est"])]
          + ([_num(float(np.mean(s["staleness"])))] if stale and s["staleness"] else ["—"] if stale else [])
          + ["—" if not s["tokens"] else f"{np.mean(s['tokens']) / 1e3:.1f}k"] for label, s in cs.items()]
  return _table(header, rows)


def critic_table(cs: dict) -> str:
  rows = []
  for label, s in cs.items():
    pre, rl = s["critic"], s["critic_rl"]
    if pre is None and not rl["explained_variance"]:
      continue
    mean = lambda xs: _num(float(np.mean(xs))) if xs else "—"  # noqa: E731

    def with_ends(key):
      if pre is None or pre.get(key) is None:
        return "—"
      return (f"{pre[key]:.2f} [{pre[key + '_lo']:.2f}, {pre[key + '_hi']:.2f}]" if pre["interval"]
              else f"{pre[key]:.2f}" + (" (point)" if key == "ratio" else ""))

    bar = "—" if pre is None or pre["bar"] is None else (
        ("**no**" if pre["bar"] == "no" else pre["bar"]) + f" ({pre['fit_seeds']} of {pre['n']} seeds)")
    rows.append([label, "no (vp off)" if pre is None else f"{pre['n']} of {pre['seeds']}",
                 with_ends("ev"), with_ends("oracle"), with_ends("ratio"), bar,
                 "—" if pre is None or not pre.get("sessions") else pre["sessions"],
                 mean(rl["explained_variance"]), mean(rl["oracle_explained_variance"])])
  if not rows:
    return ""
  return ("Critics (explained variance of Monte-Carlo returns on value pretraining's held-out readout; oracle = "
          "the mean return of the sessions sharing the turn and the turn-0 decision; [95% session-bootstrap "
          "interval]). A critic is fit when its EV reaches "
          f"{CRITIC_BAR} x the oracle's, judged on the ratio's interval: yes when its lower end is >= {CRITIC_BAR}, "
          f"**no** when its upper end is below {CRITIC_BAR} (the comparisons that rely on it are not tested), "
          "uncertain when it straddles the bar (they are tested; the interval is the one shown here). Over "
          "several critic seeds a cell shows the means of their ends (wider than an interval on the mean); "
          "seeds at the bar count those whose own lower end reaches it. A record without an interval "
          "(written before value pretraining kept one) is judged on the point ratio, marked (point).\n\n"
          + _table(["cell", "pretrained critic", "EV before RL", "oracle EV", "EV / oracle", "at the bar",
                    "readout sessions", "EV during RL", "oracle EV during RL"], rows))


def format_check(cs: dict) -> str:
  lost = [f"`{label}` ({sum(x > INVALID_BAR for x in s['invalid_max'])} of {len(s['invalid_max'])} seeds, "
          f"worst {max(s['invalid_max']):.0%} of turns)" for label, s in cs.items()
          if s["invalid_max"] and max(s["invalid_max"]) > INVALID_BAR]
  if not lost:
    return f"Action format: every run kept invalid actions at or below {INVALID_BAR:.0%} of turns in every update."
  return f"Action format lost (invalid actions above {INVALID_BAR:.0%} of turns in some update): " + "; ".join(lost) + "."


def figure(exp, cs: dict, path: str) -> None:
  fig, ax = plt.subplots(figsize=(8, 4.5))
  if exp.figure == "bars" or grid(exp):
    labels = list(cs)
    est = [cs[k]["final_est"] for k in labels]
    mean = [e.mean if e.mean is not None else np.nan for e in est]
    err = [[e.mean - e.lo if e.mean is not None else 0 for e in est],
           [e.hi - e.mean if e.mean is not None else 0 for e in est]]
    ax.bar(np.arange(len(labels)), mean, yerr=err, capsize=3)
    ax.set_xticks(np.arange(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("final eval success (mean, 95% t interval over seeds)")
  else:  # mean rollout success vs mean tokens over seeds, at the steps every seed has; band = min..max
    for label, s in cs.items():
      curves = [dict(zip(r["rollout"]["step"], zip(r["rollout"]["tokens"], r["rollout"]["success"])))
                for r in s["recs"].values()]
      steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
      if not steps:
        continue
      t_sr = np.array([[c[st][0] for c in curves] for st in steps])
      y_sr = np.array([[c[st][1] for c in curves] for st in steps])
      line, = ax.plot(t_sr.mean(1), y_sr.mean(1), label=f"{label} (n={len(curves)})")
      ax.fill_between(t_sr.mean(1), y_sr.min(1), y_sr.max(1), color=line.get_color(), alpha=0.12)
    ax.set_xlabel("tokens seen (generated + prefilled)")
    ax.set_ylabel("rollout success (mean over seeds; band min..max)")
    if ax.lines:
      ax.legend(fontsize=8)
  ax.set_ylim(-0.03, 1.03)
  ax.grid(alpha=0.3)
  ax.set_title(f"{exp.id}: {exp.title}")
  fig.tight_layout()
  fig.savefig(path, dpi=110, metadata={"Software": None})
  plt.close(fig)


def factor_sentence(items: list) -> str:
  """Which factor contrasts differ after Holm, grouped by factor kind (normalisation / credit structure / scale)."""
  hits = {}
  for it in items:
    if it["kind"] != "factor" or it["untested"]:
      continue
    kind = it["factor"].split(" (")[0].split(",")[0]
    sig = [m for m, j in it["judged"].items() if j in ("A>B", "B>A")]
    hits.setdefault(kind, []).append(f"`{it['a']}` vs `{it['b']}`: " + (
        ", ".join(f"{m} {it['judged'][m]} ({_diff(it['tests'][m][1])})" for m in sig) if sig else "no difference "
        f"after Holm (final {_diff(it['tests']['final'][1])}, MDE {_num(it['tests']['final'][1] and it['tests']['final'][1].mde, '{:.3f}')})"))
  if not hits:
    return ""
  return "**Which differences are normalisation and which are credit structure.** " + " ".join(
      f"{kind.capitalize()}: " + "; ".join(v) + "." for kind, v in hits.items())


def section(exp, cs: dict, items: list, verdict: str, fig_rel: str) -> str:
  recs = [r for s in cs.values() for r in s["recs"].values()]
  missing = [n for s in cs.values() for n in s["missing"]]
  cfg = next((r["config"] for r in recs if r.get("config")), {})
  sizes = (f"{cfg.get('rl.steps')} RL steps x {cfg.get('rl.tasks_per_update')} tasks x group "
           f"{cfg.get('rl.group_size')}, eval on {cfg.get('eval.tasks')} held-out tasks (the records' config)"
           if cfg else "sizes: see configs/study.py")
  walls = [w for s in cs.values() for w in s["wall"]]
  wall = (f"{np.mean(walls) / 60:.1f} min per run ({len(walls)} timed)" if walls else "not recorded")
  mine = [i for i in items if i["exp"] == exp.id]
  cells = "; ".join(f"`{label}` = `{s['cell'].name}`" for label, s in cs.items())
  verdicts = [f"{i['a']} > {i['b']}: {comparison_verdict(exp, i, items)}" for i in mine if i["kind"] == "claim"]
  ctl = [f"`{i['a']}` vs `{i['b']}`: " + ("not run" if i["untested"] else
         ("separates" if i["separates"] else "**does not separate**") + f" (final {_diff(i['tests']['final'][1])}, "
         f"AUC {_diff(i['tests']['auc'][1])})") for i in mine if i["kind"] == "control"]
  fs = factor_sentence(mine)
  crit = critic_table(cs)
  return "\n".join([
      f"## {exp.id}: {exp.title}", "",
      f"**Question.** {exp.question}", "",
      f"**Published claim.** {exp.claim} ({exp.source})", "",
      f"**Setup.** {exp.note + '. ' if exp.note else ''}{sizes}; seeds {', '.join(map(str, exp.seeds))}; "
      f"{len(recs)} runs recorded, {len(missing)} missing; CPU wall time {wall}.", "",
      f"Cells: {cells}.", "",
      cell_table(exp, cs), "",
      *([crit, ""] if crit else []),
      format_check(cs), "",
      f"![{exp.id}]({fig_rel})", "",
      "**Positive control** (the reference arm against its advantages shuffled within the batch): "
      + ("; ".join(ctl) if ctl else "none") + ".", "",
      "Paired tests (A - B per seed; claims and factor contrasts in the study's Holm family):", "",
      _table(TEST_HEADER, comparison_rows(mine)), "",
      *([fs, ""] if fs else []),
      f"**{exp.id}: {verdict}** ({exp.title}): " + "; ".join(verdicts) + ".", "",
      *([f"<details><summary>missing runs ({len(missing)})</summary>\n\n" + "\n".join(f"- `{m}`" for m in missing)
         + "\n\n</details>", ""] if missing else [])])


def probe_table(warm: dict, ceilings: dict) -> str:
  names = list(dict.fromkeys([warm_name(*p) for p in PROBES] + sorted(warm)))
  rows = []
  for name in names:
    kv = dict(p.split("=", 1) for p in name.split(",") if "=" in p)
    r = warm.get(name)
    top = (r or {}).get("ceiling")
    top = top if top is not None else (ceilings.get(name) or {}).get("ceiling")
    rows.append([kv.get("probe", name), kv.get("horizon", "—"), (r or {}).get("sft_steps", "—"),
                 "built" if r else "no record", _num(r and r["success"], "{:.3f}"),
                 _num(r and r.get("greedy_success"), "{:.3f}"), _num(top, "{:.3f}")])
  return ("Warm start = behaviour cloning on quality-0.5 demos; ceiling = the share of the RL cells' 256 "
          "held-out eval tasks the env's expert policy succeeds on (what a perfect policy reaches; a dash: the "
          "env could not be built where the records were written, e.g. TextArena not installed).\n\n"
          + _table(["probe", "horizon", "BC steps", "warm start", "sampled success", "greedy success", "ceiling"],
                   rows))


def critic_warm_table(crit: dict) -> str:
  if not crit:
    return "No critic records."
  rows = []
  for (warm, seed), rec in sorted(crit.items()):
    r = rec["readout"]
    kv = dict(p.split("=", 1) for p in warm.split(",") if "=" in p)
    ratio = r["explained_variance"] / r["oracle_explained_variance"] if r.get("oracle_explained_variance") else None
    lo, hi = r.get("ev_over_oracle_lo"), r.get("ev_over_oracle_hi")

    def with_ends(x, key):
      a, b = r.get(f"{key}_lo"), r.get(f"{key}_hi")
      return _num(x, "{:.3f}") + ("" if x is None or a is None or b is None else f" [{a:.3f}, {b:.3f}]")

    if lo is not None and hi is not None:
      bar = "yes" if lo >= CRITIC_BAR else "**no**" if hi < CRITIC_BAR else "uncertain"
    else:
      bar = ("yes" if ratio is not None and ratio >= CRITIC_BAR else "**no**") + " (point)"
    rows.append([kv.get("probe"), kv.get("horizon"), seed, r.get("critic_steps"), _num(r.get("readout_sessions"), "{}"),
                 with_ends(r["explained_variance"], "explained_variance"),
                 with_ends(r["oracle_explained_variance"], "oracle_explained_variance"),
                 with_ends(ratio, "ev_over_oracle"),
                 _num(r.get("decision_gap"), "{:.3f}"), _num(r.get("oracle_decision_gap"), "{:.3f}"), bar])
  return (f"Value pretraining of the critic each critic arm starts RL with, scored on held-out sessions: "
          f"explained variance of Monte-Carlo returns, the oracle critic's, their ratio (bar: {CRITIC_BAR}; "
          "[95% session-bootstrap interval]) and the value gap between the two turn-0 decisions. At the bar: "
          f"yes when the ratio's interval lies at or above {CRITIC_BAR}, **no** when below it, uncertain when it "
          "straddles it; (point): a record without an interval, judged on the point ratio.\n\n"
          + _table(["probe", "horizon", "seed", "critic steps", "readout sessions", "EV", "oracle EV", "EV / oracle",
                    "decision gap", "oracle gap", "at the bar"], rows))


def lab_section(records_dir: str, figdir: str, rel: str) -> str:
  """The lab's agreement plots already in the figure folder (docs/study/lab_*.png)."""
  pngs = sorted(glob.glob(os.path.join(figdir, "lab_*.png")))
  if not pngs:
    return "No lab figure in the record folder."
  return ("The credit-accuracy lab (`python -m mtrl_jax.lab.credit_accuracy`, docs/lab.md) on E1's warm "
          "starts; its numbers are in docs/lab.md.\n\n"
          + "\n\n".join(f"![{os.path.basename(p)}]({rel}/{os.path.basename(p)})" for p in pngs))


STATS = f"""**Statistics.** The design is paired: at one seed every arm starts from the same warm start, trains on
the same task seeds and is evaluated on the same 256 held-out tasks with the same eval keys. A claim "A beats
B" is judged on the per-seed differences d = A - B (final success and AUC): their mean, a Student t 95%
interval on it (its coverage at n = 8 was checked by simulation on a normal null: 95% +- 1.5 points; the
per-arm percentile bootstrap this file used before covers about 88% there, tests/experiments/test_stats.py),
the two-sided paired t p-value, the effect size dz = mean(d) / sd(d), and the minimum detectable effect (MDE:
the true mean difference a paired t test at this n and this sd of d detects with power 0.8 at alpha 0.05).
The p-values of every claim and factor contrast of the study, both metrics, form one Holm family (alpha
{stats.ALPHA}). A claim is **reproduced** when A > B on some metric after Holm and B > A on none; **not
reproduced** when B > A on some metric after Holm; **underpowered** when neither and the experiment's
positive control did not separate (unadjusted p < {stats.ALPHA}, A > B on some metric): the design could not
see a difference known to exist; **inconclusive (MDE x)** when neither and the control separated: a true
difference of x would have been found with probability 0.8 by one paired t test at alpha 0.05 (under Holm's
correction the family's tests need larger differences, so x is a lower bound); **not tested** when a
side has no records or its critic is below the bar. The per-cell intervals in the tables are t intervals of
the mean over seeds: descriptive, not the test."""

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
(`python experiments/report.py`; schema in experiments/records.py). The study run reported at commit
{LOST[0]} (root {LOST[1]}, 160 runs) kept no per-run data: its tables and verdicts (that file's history)
cannot be recomputed; they compared per-arm percentile-bootstrap intervals by overlap, without the pairing,
the positive controls or a multiplicity correction. The last section says what each of them could not test.

Generated: {date}
Runs: {n_runs} recorded, {n_missing} missing (of the plan: every cell x seed).

Reproduce (CPU, resumable; each finished run writes its record under docs/study/):
```bash
python experiments/study.py --root ROOT --parallel 2 --probes
python experiments/report.py
```"""


def report(records_dir: str, out: str, figdir: str, date: str | None = None, figures: bool = True,
           experiments=EXPERIMENTS) -> dict:
  """Writes `out` (and the figures, unless `figures` is False) from the records in `records_dir`; returns
  every verdict."""
  got = records_mod.load(records_dir)
  runs = got["runs"]
  os.makedirs(figdir, exist_ok=True)
  rel = os.path.relpath(figdir, os.path.dirname(os.path.abspath(out)))
  cstats = {e.id: cell_stats(e, runs, got["critics"]) for e in experiments}
  # A cut experiment counts as run only with records of a cell of its own (E5 shares ms_grpo h8 with E1).
  uncut = {c.name for e in experiments if not e.cut for c in e.cells}
  ran = [e for e in experiments if any(s["recs"] for s in cstats[e.id].values()
                                       if not e.cut or s["cell"].name not in uncut)]
  tests = study_tests(ran, cstats)
  items = tests["items"]
  result, sections, headline = {}, [], []
  for exp in experiments:
    cs = cstats[exp.id]
    if exp not in ran:
      why = f"cut from this round ({exp.cut})" if exp.cut else "not run (no records)"
      headline.append(f"- **{exp.id}** {exp.title}: {why}")
      result[exp.id] = {"verdict": "cut" if exp.cut else "not run", "cells": {}}
      continue
    verdict = experiment_verdict(exp, items)
    if figures:
      figure(exp, cs, os.path.join(figdir, f"{exp.id}.png"))
    sections.append(section(exp, cs, items, verdict, f"{rel}/{exp.id}.png"))
    mine = [i for i in items if i["exp"] == exp.id]
    headline.append(f"- **{exp.id}** {exp.title}: **{verdict}**")
    result[exp.id] = {
        "verdict": verdict,
        "comparisons": {f"{i['a']} > {i['b']}": comparison_verdict(exp, i, items) for i in mine if i["kind"] == "claim"},
        "factors": {f"{i['a']} > {i['b']}": ("not tested" if i["untested"] else i["judged"]) for i in mine
                    if i["kind"] == "factor"},
        "controls": {f"{i['a']} > {i['b']}": (None if i["untested"] else i["separates"]) for i in mine
                     if i["kind"] == "control"},
        "cells": {label: {"n": s["final_est"].n, "final": s["final_est"].mean,
                          "final_ci": [s["final_est"].lo, s["final_est"].hi] if s["final_est"].n else None,
                          "auc": s["auc_est"].mean} for label, s in cs.items()}}
  planned = {(c.name, s) for e in experiments if not e.cut or e in ran for c in e.cells for s in e.seeds}
  n_done = len(planned & set(runs))
  date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  shown = os.path.relpath(os.path.abspath(records_dir), records_mod.REPO)
  text = "\n\n".join([header(n_done, len(planned) - n_done, date, shown if not shown.startswith("..") else records_dir),
                      "<!-- headline -->\n" + "\n".join(headline) + "\n<!-- /headline -->",
                      f"Holm family: {tests['family']} tests (claims and factor contrasts x final success and AUC).",
                      cost(got),
                      "## Probe tasks: the warm start and the ceiling\n\n" + probe_table(got["warm"], got["ceilings"]),
                      "## The critics before RL\n\n" + critic_warm_table(got["critics"]),
                      "## Credit-accuracy lab\n\n" + lab_section(records_dir, figdir, rel), *sections,
                      "## The 2026-11-27 verdicts, relabelled\n\n" + old_verdicts()])
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    f.write(text.rstrip() + "\n")
  return {"experiments": result, "runs": n_done, "missing": len(planned) - n_done, "holm_family": tests["family"]}


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", choices=("byte", "smol"), default="byte",
                 help="smol: the study on SmolLM2 (experiments/study.py --model smol; its records and report apart)")
  p.add_argument("--records", default=None, help="the record folder (experiments/records.py; default docs/study, "
                                                 "docs/study_smol with --model smol)")
  p.add_argument("--out", default=None, help="default docs/STUDY.md, docs/STUDY_smol.md with --model smol")
  p.add_argument("--figdir", default=None, help="where the figures go (default: the record folder)")
  a = p.parse_args(argv)
  smol = a.model == "smol"
  a.records = a.records or (SMOL_RECORDS if smol else records_mod.DEFAULT_OUT)
  a.out = a.out or os.path.join(records_mod.REPO, "docs", "STUDY_smol.md" if smol else "STUDY.md")
  if not os.path.isdir(a.records):
    p.error(f"--records {a.records} is not a folder")
  result = report(a.records, a.out, a.figdir or a.records, experiments=plan(a.model))
  print(a.out)
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
