"""The study's judgements: each cell's numbers, every claim's paired tests, Holm, and the verdicts.

From the records (records.load) and the plan (plan.py): a cell's per-seed final success and AUC and
their descriptive means, the pretrained critic its runs started from and whether it passes the
critic bar (mtrl_jax/train/critic_bar.py: the package's one rule; a deliberately partial critic, round 3's,
is judged on its registered band instead, round3.PARTIAL_BAND), the paired t test of every claim,
factor contrast and positive control, Holm over the claims' and factors' tests of the whole study,
and the words each claim and each experiment gets (stats.paired_verdict). No layout: tables.py and
report.py print what this returns.
"""
from __future__ import annotations

import re

import numpy as np

from experiments.study import stats
from experiments.study.plan import SEEDS, critic_warm
from experiments.study.round3 import MACHINE_KINDS, PARTIAL_BAND, critic_state
from mtrl_jax.train.critic_bar import CRITIC_BAR, bar_of

METRICS = ("final", "auc")


class Mean:
  """A cell's mean over seeds with a t interval (descriptive; the claims are judged on paired differences)."""

  def __init__(self, values):
    self.values = [float(v) for v in values]
    self.n = len(self.values)
    self.mean = float(np.mean(self.values)) if self.values else None
    self.lo, self.hi = (stats.t_interval(self.values) if self.n >= 2 and np.std(self.values) > 0
                        else (self.mean, self.mean))


# ------------------------------------------------------------------ per cell


def critic_key(name: str) -> tuple[str, int]:
  """records.load's key, (warm, seed), of the critic record of a critic warm start named `name`
  (plan.critic_warm): records.critic_record keeps the name's head as `warm`, a partial critic's `,vpr=` in it."""
  warm, _, seed = name.rpartition(",critic,seed=")
  return warm, int(seed)


def cell_critic(cell, crit: dict) -> dict | None:
  """The pretrained critic a cell's runs started from (the probe's one critic warm start), or None.

  `bar` is the critic bar's word (mtrl_jax/train/critic_bar.bar_of) on the ratio's 95% session-bootstrap
  interval: "yes" (its lower end >= the bar), "no" (its upper end below it) or "uncertain" (it straddles it). Over several critic seeds
  the cell's ends are the means of theirs: wider than an interval on the mean ratio, never narrower.
  A record without ends (written before they existed) makes the cell's judgement the point ratio's
  (`interval` False), "yes" or "no".

  The record is looked up under the cell's own critic warm start (critic_key of critic_warm's name), so a
  partial cell reads its partial critic, not the probe's full one. `partial`: the cell's critic is
  deliberately partial (round3.critic_state), judged on round3.PARTIAL_BAND, not on the bar
  (untested_because).
  """
  names = sorted({cw for s in SEEDS if (cw := critic_warm(cell, s))})
  if not names:
    return None
  got = [crit.get(critic_key(n)) for n in names]
  done = [g["readout"] for g in got if g]
  partial = critic_state(cell) == "partial"
  if not done:
    return {"n": 0, "seeds": len(got), "ev": None, "oracle": None, "ratio": None, "fit_seeds": 0, "bar": None,
            "interval": False, "partial": partial}
  mean = lambda key: float(np.mean([g[key] for g in done]))  # noqa: E731
  ev, oracle = mean("explained_variance"), mean("oracle_explained_variance")
  ratios = [g["explained_variance"] / g["oracle_explained_variance"] for g in done if g["oracle_explained_variance"]]
  ratio = float(np.mean(ratios)) if ratios else None
  ends = ("explained_variance", "oracle_explained_variance", "ev_over_oracle")
  interval = all(g.get(f"{k}_{e}") is not None for g in done for k in ends for e in ("lo", "hi"))
  out = {"n": len(done), "seeds": len(got), "ev": ev, "oracle": oracle, "ratio": ratio, "interval": interval,
         "partial": partial}
  if interval:
    for k, short in zip(ends, ("ev", "oracle", "ratio")):
      out[f"{short}_lo"], out[f"{short}_hi"] = mean(f"{k}_lo"), mean(f"{k}_hi")
    out["sessions"] = min(int(g.get("readout_sessions") or 0) for g in done)
    out["bar"] = bar_of(ratio, out["ratio_lo"], out["ratio_hi"])
    out["fit_seeds"] = sum(bar_of(None, g["ev_over_oracle_lo"], g["ev_over_oracle_hi"]) == "yes" for g in done)
  else:
    out["bar"] = bar_of(ratio)
    out["fit_seeds"] = sum(bar_of(r) == "yes" for r in ratios)
  return out


def kind_name(folder: str) -> str:
  """A machine kind's short name (round3.MACHINE_KINDS: 'AMD EPYC (2 cores)' -> 'AMD EPYC'), or the folder."""
  label = dict(MACHINE_KINDS).get(folder, folder)
  return label.split(",")[0].split(" (")[0]


def critic_over_kinds(cell, kind_crit: dict, used: list[str]) -> dict | None:
  """Amendment 1 (docs/STUDY_ROUND3.md): a cell whose runs come from several machine kinds, or from one that is
  not the round's own, started from each kind's own critic. Each is summarised by cell_critic on its kind's
  records (`by_kind`, in `used` order); the pooled fields are their means (ends too, as over critic seeds),
  `bar` the worst kind's word, `n` and `seeds` the sums. in_band and untested_because judge each kind."""
  parts = {k: cell_critic(cell, kind_crit.get(k, {})) for k in used}
  if any(v is None for v in parts.values()):
    return None
  vals = list(parts.values())
  done = [v for v in vals if v["n"]]
  out = {"n": sum(v["n"] for v in vals), "seeds": sum(v["seeds"] for v in vals), "partial": vals[0]["partial"],
         "by_kind": parts, "fit_seeds": sum(v["fit_seeds"] for v in vals),
         "interval": bool(done) and all(v["interval"] for v in done)}
  if len(done) < len(vals):  # a kind without its critic record: the cell reads as having none
    return {**out, "n": 0, "ev": None, "oracle": None, "ratio": None, "bar": None, "interval": False}
  for key in ("ev", "oracle", "ratio") + (("ev_lo", "ev_hi", "oracle_lo", "oracle_hi", "ratio_lo", "ratio_hi")
                                          if out["interval"] else ()):
    xs = [v[key] for v in done]
    out[key] = None if any(x is None for x in xs) else float(np.mean(xs))
  if out["interval"]:
    out["sessions"] = min(v.get("sessions") or 0 for v in done)
  words = {v["bar"] for v in done}
  out["bar"] = next((w for w in ("no", "uncertain", None, "yes") if w in words), None)
  return out


def cell_stats(exp, runs: dict, crit: dict, kind_crit: dict | None = None) -> dict:
  """label -> the cell's records by seed, missing seeds, per-seed metrics and descriptive means.

  `kind_crit` ({kind folder: critics}, kinds.load_all's "kinds"; round 3's amendment 1): a cell whose runs
  come from more than the round's own kind gets critic_over_kinds over the kinds its runs name (`_kind`)."""
  out = {}
  first = next(iter(kind_crit)) if kind_crit else None
  for cell in exp.cells:
    recs = {s: runs[(cell.name, s)] for s in exp.seeds if (cell.name, s) in runs}
    kinds_here = {r.get("_kind", first) for r in recs.values()}
    used = [k for k in kind_crit if k in kinds_here] if kind_crit else []  # in the registry's order
    critic = (critic_over_kinds(cell, kind_crit, used) if used and used != [first]
              else cell_critic(cell, crit))
    by = {"final": {s: r["final"]["success"] for s, r in recs.items()},
          "auc": {s: r["auc"] for s, r in recs.items() if r.get("auc") is not None}}
    out[cell.label] = {
        "cell": cell, "recs": recs, "missing": [f"{cell.name},seed={s}" for s in exp.seeds if s not in recs],
        **by, "final_est": Mean(by["final"].values()), "auc_est": Mean(by["auc"].values()),
        "invalid_max": [r["invalid_share"]["max"] for r in recs.values() if r.get("invalid_share")],
        "tokens": [r["rollout"]["tokens"][-1] for r in recs.values() if r["rollout"]["tokens"]],
        "wall": [r["wall_s"] for r in recs.values() if r.get("wall_s")],
        "staleness": [r["staleness"] for r in recs.values() if r.get("staleness") is not None],
        "critic": critic,
        "critic_rl": {k: [r["critic"][k] for r in recs.values() if k in (r.get("critic") or {})]
                      for k in ("explained_variance", "oracle_explained_variance")}}
  return out


BAND_WORDS = f"the registered band {PARTIAL_BAND[0]:g}-{PARTIAL_BAND[1]:g}"


def in_band(c: dict) -> bool:
  """A partial critic's handed-over point ratio lies in round3.PARTIAL_BAND (ends included). The point, not
  the interval: the band says what the critic was stopped at (about 0.3-0.6), not a bar it must clear."""
  if "by_kind" in c:  # amendment 1: every machine kind's own partial critic
    return all(v["n"] and in_band(v) for v in c["by_kind"].values())
  return c["ratio"] is not None and PARTIAL_BAND[0] <= c["ratio"] <= PARTIAL_BAND[1]


def _partial_said(lab: str, c: dict) -> str:
  """'`lab`'s partial critic read 0.54 [95% 0.53, 0.56] x the oracle's EV' (its interval, where the record has one);
  over machine kinds (amendment 1), each kind's reading."""
  if "by_kind" in c:
    if any(v["ratio"] is None for v in c["by_kind"].values()):
      return f"`{lab}`'s partial critic has no EV ratio on some machine kind (the oracle explains nothing)"
    return f"`{lab}`'s partial critics read " + " and ".join(
        _ratio_ends(v) + f" on the {kind_name(k)}" for k, v in c["by_kind"].items()) + " x the oracle's EV"
  if c["ratio"] is None:
    return f"`{lab}`'s partial critic has no EV ratio (the oracle explains nothing)"
  return f"`{lab}`'s partial critic read {_ratio_ends(c)} x the oracle's EV"


def _ratio_ends(c: dict) -> str:
  """'0.54 [95% 0.53, 0.56]' (or the point ratio, said so, for a record without an interval)."""
  return f"{c['ratio']:.2f}" + (f" [95% {c['ratio_lo']:.2f}, {c['ratio_hi']:.2f}]" if c["interval"]
                                 else " (point ratio: the record has no interval)")


def untested_because(cs: dict, *labels, uncertain: bool = False) -> str | None:
  """Why a comparison cannot test its claim: a side without runs, a pretrained critic below the bar, a
  partial critic outside its band, or None.

  Below the bar: the ratio's interval wholly below CRITIC_BAR (cell_critic), or, for records without
  an interval, the point ratio below it (said so). A critic whose interval straddles the bar leaves
  the comparison tested; `uncertain=True` returns the sentence that says so (None when no critic
  straddles it), for the verdict line. A deliberately partial critic (cell_critic's `partial`: round 3's
  value pretraining stopped at PARTIAL_RATIO on purpose) is not held to the bar: its point ratio outside
  round3.PARTIAL_BAND (or no ratio) makes the comparison not tested; inside it, partial_note says so.
  """
  def ratio_said(c):
    if not c["interval"]:
      return f"{c['ratio']:.2f} x the oracle's {c['oracle']:.2f} (point ratio: the record has no interval)"
    return (f"{c['ratio']:.2f} [95% {c['ratio_lo']:.2f}, {c['ratio_hi']:.2f}] x the oracle's "
            f"{c['oracle']:.2f}")

  both = [(lab, c) for lab in labels if (c := cs[lab]["critic"])]
  partial = [(lab, c) for lab, c in both if c.get("partial")]
  # Amendment 1: a full critic over several machine kinds is judged on each kind's own (`on`: which).
  critics = [x for lab, c in both if not c.get("partial") for x in (
      [(lab, v, f" on the {kind_name(k)}") for k, v in c["by_kind"].items()] if "by_kind" in c else [(lab, c, "")])]
  if uncertain:
    said = [f"`{lab}`'s critic{on} EV {c['ev']:.2f} = {ratio_said(c)}" for lab, c, on in critics
            if c["bar"] == "uncertain"]
    return ("; ".join(said) + f": the ratio's interval straddles the bar ({CRITIC_BAR}), so the critic may be "
            "below it") if said else None
  unrun = [lab for lab in labels if not cs[lab]["recs"]]
  if unrun:
    return "no records of " + " and ".join(f"`{lab}`" for lab in unrun)
  weak = [f"`{lab}`'s critic{on} EV {c['ev']:.2f} = {ratio_said(c)}" for lab, c, on in critics
          if c["bar"] == "no" and c["ratio"] is not None]
  missing = [f"`{lab}` has no critic record{on}" for lab, c, on in critics if c["n"] == 0]
  why = weak + missing
  bar = "; ".join(why) + f" (bar: {CRITIC_BAR} x the oracle's EV before RL)" if why else None
  off = [f"`{lab}` has no critic record" if c["n"] == 0 else f"{_partial_said(lab, c)}, outside {BAND_WORDS}"
         for lab, c in partial if not in_band(c)]
  return "; ".join([bar, *off] if bar else off) or None


def partial_note(cs: dict, *labels) -> str | None:
  """The verdict line's sentence on a tested comparison's partial critics: each one's ratio and interval,
  inside the registered band (None when no side has a partial critic)."""
  said = [f"{_partial_said(lab, c)}, inside {BAND_WORDS}" for lab in labels
          if (c := cs[lab]["critic"]) and c.get("partial") and c["n"] and in_band(c)]
  return "; ".join(said) or None


def critic_notes(it: dict) -> str:
  """What a tested comparison's verdict adds on its critics: a critic straddling the bar, a partial one's band."""
  return ((f" (critic uncertain: {it['critic_note']})" if it.get("critic_note") else "")
          + (f" ({it['partial_note']})" if it.get("partial_note") else ""))


# ------------------------------------------------------------------ tests and verdicts


def paired_tests(cs: dict, a: str, b: str) -> dict:
  """metric -> (seeds, PairedTest or None) for "a beats b" over the seeds both cells have."""
  out = {}
  for m in METRICS:
    seeds, d = stats.paired(cs[a][m], cs[b][m])
    out[m] = (seeds, stats.paired_test(d))
  return out


def study_tests(exps: list, cstats: dict, code=None) -> dict:
  """Every claim, factor contrast and control of the study, tested; Holm over the claims' and the
  factors' tests (both metrics) of the whole study; controls unadjusted (a check of the design).
  `code` (versions.CodeCheck): a comparison whose run records' code differs beyond its allowed files
  is not tested."""
  items = []
  for exp in exps:
    cs = cstats[exp.id]
    for kind, pairs in (("claim", [(a, b, None) for a, b in exp.comparisons]), ("factor", exp.factors),
                        ("control", [(a, b, None) for a, b in exp.controls])):
      for a, b, what in pairs:
        why = untested_because(cs, a, b) or (code and code.refusal([*cs[a]["recs"].values(),
                                                                    *cs[b]["recs"].values()]))
        items.append({"exp": exp.id, "kind": kind, "a": a, "b": b, "factor": what, "untested": why,
                      "critic_note": None if why else untested_because(cs, a, b, uncertain=True),
                      "partial_note": None if why else partial_note(cs, a, b),
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


def _mdes(it: dict) -> list[float]:
  """A claim's MDEs, one per metric, leaving out a metric whose differences are all 0 (no MDE of its own)."""
  return [t.mde for _, t in it["tests"].values() if t is not None and not _zero(t)]


def _verdict(exp, it: dict, items: list) -> str:
  """A tested, not identical claim's words (stats.paired_verdict on its metrics and its own control)."""
  return stats.paired_verdict([tuple(it["judged"].values())], [_mdes(it)], control_ok(exp, items, it["a"]))


def comparison_verdict(exp, it: dict, items: list) -> str:
  if it["untested"]:
    return f"not tested ({it['untested']})"
  if identical(it):
    n = max(t.n for _, t in it["tests"].values() if t is not None)
    return f"no difference (identical on all {n} seeds: every paired difference is 0)"
  return _verdict(exp, it, items) + critic_notes(it)


def experiment_verdict(exp, items: list) -> str:
  """The experiment's word over its tested claims, each with its own control and MDE: one claim reversed
  makes it "not reproduced", all reproduced "reproduced"; otherwise the unresolved claims decide
  (stats.paired_verdict: underpowered when one of their controls did not separate, else inconclusive at
  the largest MDE among them)."""
  claims = [i for i in items if i["exp"] == exp.id and i["kind"] == "claim"]
  tested = [i for i in claims if not i["untested"]]
  if not tested:
    return "not tested (" + "; ".join(sorted({i["untested"] for i in claims})) + ")" if claims else "not tested"
  if all(identical(i) for i in tested):
    return "no difference (identical on every seed of every tested claim)"
  return stats.paired_verdict([tuple(i["judged"].values()) for i in tested], [_mdes(i) for i in tested],
                              [control_ok(exp, items, i["a"]) for i in tested])


# The order a claim's words are listed in the headline.
WORD_ORDER = ("reproduced", "not reproduced", "no difference", "inconclusive", "underpowered", "not tested")


METRIC_NAMES = {"final": "final", "auc": "AUC"}


def _short(exp, it: dict, items: list) -> tuple[str, str]:
  """(word, key number or "") of one claim, as the headline says it. The key number: a reproduced (not
  reproduced) claim's paired mean difference A - B on the first metric that decided it ("final +0.030");
  an inconclusive claim's MDE ("MDE 0.008"). The reason of "not tested" and of "no difference" stays in
  the experiment's section; a critic straddling the bar is flagged."""
  if it["untested"]:
    return "not tested", ""
  if identical(it):
    return "no difference", ""
  v = _verdict(exp, it, items)
  word = next(w for w in sorted(WORD_ORDER, key=len, reverse=True) if v.startswith(w))
  key = ""
  if v.startswith("inconclusive (MDE "):
    key = v[len("inconclusive ("):-1]
  elif word in ("reproduced", "not reproduced"):
    side = "A>B" if word == "reproduced" else "B>A"
    m = next(m for m in METRICS if it["judged"].get(m) == side)
    key = f"{METRIC_NAMES[m]} {it['tests'][m][1].mean:+.3f}"
  return word + (" (critic uncertain)" if it.get("critic_note") else ""), key


def _keys(keys: list[str]) -> str:
  """'final +0.030, +0.537' when every key names the same metric, else each with its own."""
  heads = {k.split(" ")[0] for k in keys}
  if len(heads) == 1:
    return heads.pop() + " " + ", ".join(k.split(" ", 1)[1] for k in keys)
  return ", ".join(keys)


def _horizon(label: str) -> tuple[str, int | None]:
  """('arm', H) for a label '<arm> h<H>', else (label, None)."""
  m = re.fullmatch(r"(.+) h(\d+)", label)
  return (m[1], int(m[2])) if m else (label, None)


def claim_lines(exp, items: list) -> list[str]:
  """The headline's line per claim (a comparison across its horizons): its verdicts, each with the
  horizons it holds at and their key numbers in that order, e.g. "`vp=on` > `vp=off`: reproduced at
  H 8, 32 (final +0.030, +0.537); inconclusive at H 2 (MDE 0.008)"."""
  groups: dict = {}
  for it in items:
    if it["exp"] != exp.id or it["kind"] != "claim":
      continue
    (a, h), (b, _) = _horizon(it["a"]), _horizon(it["b"])
    word, key = _short(exp, it, items)
    groups.setdefault((a, b), {}).setdefault(word, []).append((h, key))
  lines = []
  for (a, b), words in groups.items():
    parts = []
    for word in sorted(words, key=lambda w: (WORD_ORDER.index(w.split(" (")[0]), w)):
      hs = sorted(words[word], key=lambda x: -1 if x[0] is None else x[0])
      at = "" if hs[0][0] is None else " at H " + ", ".join(str(h) for h, _ in hs)
      keys = [k for _, k in hs if k]
      parts.append(word + at + (f" ({_keys(keys)})" if keys else ""))
    lines.append(f"`{a}` > `{b}`: " + "; ".join(parts))
  return lines
