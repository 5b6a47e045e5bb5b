"""The report's tables and figures: cells, critics, paired tests, probes, each experiment's section.

Layout only: the numbers and the words come from verdicts.py (and stats.py); the critic bar's
words from mtrl_jax/train/critic_bar.py.
"""
from __future__ import annotations

import glob
import os
import re

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.study import stats  # noqa: E402
from experiments.study.plan import PROBES, warm_name  # noqa: E402
from experiments.study.verdicts import comparison_verdict, kind_name  # noqa: E402
from mtrl_jax.train.critic_bar import CRITIC_BAR, bar_of  # noqa: E402

INVALID_BAR = 0.05  # an arm "lost the action format" when invalid actions exceed this share of turns


def _ci(e) -> str:
  return "—" if e is None or e.mean is None else f"{e.mean:.3f} [{e.lo:.3f}, {e.hi:.3f}]"


def _num(x, fmt="{:.2f}") -> str:
  return "—" if x is None else fmt.format(x)


def _table(header, rows) -> str:
  return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                   + ["| " + " | ".join(map(str, r)) + " |" for r in rows])



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
  # A cell over several machine kinds (round 3's amendment 1): a row per kind's critic, RL's columns pooled.
  each = [(label, s["critic"], s["critic_rl"]) if "by_kind" not in (s["critic"] or {}) else
          (f"{label} ({kind_name(k)})", v, s["critic_rl"]) for label, s in cs.items()
          for k, v in ((s["critic"] or {}).get("by_kind") or {None: None}).items()]
  for label, pre, rl in each:
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
  return ("Warm start = behaviour cloning on quality-0.5 demos; sampled / greedy success = the warm start's own "
          "eval on 64 held-out tasks (the RL cells' step-0 eval, on their 256, differs by its sampling); ceiling = the share of the RL cells' 256 "
          "held-out eval tasks the env's expert policy succeeds on (what a perfect policy reaches; a dash: the "
          "env could not be built where the records were written, e.g. TextArena not installed).\n\n"
          + _table(["probe", "horizon", "BC steps", "warm start", "sampled success", "greedy success", "ceiling"],
                   rows))


def cue_probe_table(warm: dict, ceilings: dict, names) -> str:
  """Round 3's probe table: per warm start in `names` (round3.probes), the warm start at the decisive turn
  (turn 0) beside the ceiling, which is read per seed (the cells' draws are the seed's)."""
  rows = []
  for name in names:
    r, top = warm.get(name) or {}, ceilings.get(name) or {}
    per = [x for x in top.get("per_seed") or [] if x is not None]
    span = (f"{top['ceiling']:.3f} [{min(per):.3f}, {max(per):.3f}] ({len(per)} seeds)"
            if per and top.get("ceiling") is not None else _num(top.get("ceiling"), "{:.3f}"))
    kv = dict(p.split("=", 1) for p in name.split(",") if "=" in p)
    rows.append([kv.get("horizon", name), r.get("sft_steps", "—"), *(
        _num(r.get(k), "{:.3f}") for k in ("success", "greedy_success", "decision_cued", "greedy_decision_cued")),
        span])
  return ("The warm start is behaviour cloning on quality-0.5 demos of `delayed(cue=True)`, one per horizon "
          "shared by the seeds (a dash: no record). Sampled / greedy success is the warm start's own eval "
          "on 64 held-out tasks, replies sampled at the rollout temperature / taken greedily. Sampled / greedy "
          "follows the sign is the share of those eval sessions whose turn-0 arm, the decisive turn, is the one "
          "the sign shows (the sign is left or right at random per task, so a policy blind to it follows it "
          "about half the time). The ceiling is the expert policy's success on the RL cells' 256 eval tasks "
          "with the cells' env (the cue, hidden draws salted by the seed), played as the eval plays them (task "
          "j as session j, reproducible): the mean over the seeds, [the lowest, the highest seed].\n\n"
          + _table(["horizon", "BC steps", "sampled success", "greedy success", "sampled follows the sign",
                    "greedy follows the sign", "ceiling (mean [seed range])"], rows))


def critic_state_word(kv: dict) -> str:
  """A critic warm start's state, from its name's `vpr` (round 3's partial critic: value pretraining stopped
  at that ratio of the oracle's EV), else the bar."""
  return f"partial (stopped at {kv['vpr']} x the oracle's EV)" if "vpr" in kv else "full (stopped at the bar)"


def critic_warm_table(crit: dict, states: bool = False) -> str:
  """The critics before RL; `states` adds the column of each critic's state (round 3, where a probe has a
  partial and a full critic; off: the second round's table, byte for byte)."""
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

    word = bar_of(ratio, lo, hi)
    point = "" if bar_of(None, lo, hi) else " (point)"  # no interval's ends: the point ratio decided
    bar = "not judged (no oracle EV)" if word is None else ("**no**" if word == "no" else word) + point
    stop = rec.get("stopped")
    how = ("—" if stop is None else
           f"{stop} after {rec.get('rounds')} rounds, {rec.get('readouts')} readout{'s' * (rec.get('readouts') != 1)}")
    rows.append([kv.get("probe"), kv.get("horizon"), *([critic_state_word(kv), how] if states else []), seed,
                 r.get("critic_steps"), _num(r.get("readout_sessions"), "{}"),
                 with_ends(r["explained_variance"], "explained_variance"),
                 with_ends(r["oracle_explained_variance"], "oracle_explained_variance"),
                 with_ends(ratio, "ev_over_oracle"),
                 _num(r.get("decision_gap"), "{:.3f}"), _num(r.get("oracle_decision_gap"), "{:.3f}"), bar])
  return (f"Value pretraining of the critic each critic arm starts RL with, scored on held-out sessions: "
          f"explained variance of Monte-Carlo returns, the oracle critic's, their ratio (bar: {CRITIC_BAR}; "
          "[95% session-bootstrap interval]) and the value gap between the two turn-0 decisions. At the bar: "
          f"yes when the ratio's interval lies at or above {CRITIC_BAR}, **no** when below it, uncertain when it "
          "straddles it; (point): a record without an interval, judged on the point ratio."
          + (" Stopped: why value pretraining ended (bar: the pooled window of its last rounds read at the bar "
             "and a readout of the critic on the fresh tasks confirmed it; ratio: a partial critic's target "
             "reached), after how many rounds, and how many readouts it played (each unconfirmed bar adds one)."
             if states else "") + "\n\n"
          + _table(["probe", "horizon", *(["critic", "stopped"] if states else []), "seed", "critic steps",
                    "readout sessions",
                    "EV", "oracle EV", "EV / oracle", "decision gap", "oracle gap", "at the bar"], rows))


def lab_section(records_dir: str, figdir: str, rel: str) -> str:
  """The lab's agreement plots already in the figure folder (docs/study/lab_*.png)."""
  pngs = sorted(glob.glob(os.path.join(figdir, "lab_*.png")))
  if not pngs:
    return "No lab figure in the record folder."
  return ("The credit-accuracy lab (`python -m mtrl_jax.lab.credit_accuracy`, docs/lab.md) on E1's warm "
          "starts; its numbers are in docs/lab.md.\n\n"
          + "\n\n".join(f"![{os.path.basename(p)}]({rel}/{os.path.basename(p)})" for p in pngs))
