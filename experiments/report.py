"""docs/STUDY.md and its figures from the runs of the credit-assignment study (experiments/study.py).

  python experiments/report.py --root ROOT [--out docs/STUDY.md] [--figdir docs/study] [--boot 2000]

Reads ROOT/runs/<cell>,seed=<s>/metrics.jsonl (+ wall.json, config.json) and
ROOT/warm/<probe>/metrics.jsonl. A run counts once its final `eval` line is
there; the others are listed as missing and left out of every number. Prints
the markdown path, then (last line) one JSON object with every verdict. The
same ROOT gives the same STUDY.md, byte for byte, but for the date line.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import shutil
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stats  # noqa: E402
from mtrl_jax.metrics import read_metrics  # noqa: E402
from plot import rl_curves  # noqa: E402
from study import CONFIG, E6_SEEDS, EXPERIMENTS, PROBES, SEEDS, warm_name  # noqa: E402

AUC_DEF = ("AUC = area under rollout success vs `tokens_seen` (trapezoid over the RL steps) divided by "
           "the token span: the token-weighted mean training success, higher = learns sooner per token.")


def _json(path: str) -> dict | None:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError):
    return None


def load_run(workdir: str) -> dict | None:
  """One finished run's numbers; None if it has no final `eval` line (unfinished or absent)."""
  if not os.path.isfile(os.path.join(workdir, "metrics.jsonl")):
    return None
  recs = read_metrics(workdir)
  finals = [r for r in recs if r.get("stage") == "eval" and r.get("eval/success") is not None]
  if not finals:
    return None
  c = rl_curves(recs)  # drops the steps a resumed run rewrote
  steps, tokens, succ = c.get("rollout/success", ([], [], []))
  stale = [r["staleness/mean"] for r in recs if r.get("stage") == "rl" and r.get("staleness/mean") is not None]
  rl = [r for r in recs if r.get("stage") == "rl" and r.get("ledger/turns")]
  invalid = [r.get("ledger/invalid_actions", 0.0) / r["ledger/turns"] for r in rl]
  critic = {k: float(np.mean(v)) for k in ("explained_variance", "oracle_explained_variance", "decision_gap",
                                            "oracle_decision_gap")
            if (v := [r[f"value/{k}"] for r in recs if r.get("stage") == "rl" and r.get(f"value/{k}") is not None])}
  return {"final": float(finals[-1]["eval/success"]), "auc": stats.auc(tokens, succ),
          "invalid_max": max(invalid) if invalid else None, "critic_rl": critic,
          "curve": dict(zip(steps, zip(tokens, succ))), "tokens": c["tokens"][-1] if c["tokens"] else None,
          "staleness": float(np.mean(stale)) if stale else None,
          "wall": (_json(os.path.join(workdir, "wall.json")) or {}).get("wall_s"),
          "config": _json(os.path.join(workdir, "config.json"))}


CRITIC_BAR = 0.8  # a pretrained critic is fit to test a claim when its EV >= this x the oracle's
INVALID_BAR = 0.05  # an arm "lost the action format" when invalid actions exceed this share of turns


def load_critic(workdir: str) -> dict | None:
  """A critic warm start's final readout (value pretraining's last, held-out batch), or None."""
  if not os.path.isfile(os.path.join(workdir, "metrics.jsonl")):
    return None
  final = [r for r in read_metrics(workdir) if r.get("value_pretrain/final")]
  if not final:
    return None
  r = final[-1]
  out = {k: r.get(f"value_pretrain/{k}") for k in ("explained_variance", "oracle_explained_variance", "r2",
                                                    "decision_gap", "oracle_decision_gap", "critic_steps")}
  ev, oracle = out["explained_variance"], out["oracle_explained_variance"]
  out["ratio"] = ev / oracle if ev is not None and oracle else None
  out["fit"] = out["ratio"] is not None and out["ratio"] >= CRITIC_BAR
  return out


def critics(root: str) -> dict:
  """(warm start, seed) -> critic readout, for every critic warm start under ROOT/warm/."""
  out = {}
  for d in sorted(glob.glob(os.path.join(root, "warm", "*,critic,seed=*"))):
    warm, _, seed = os.path.basename(d).rpartition(",critic,seed=")
    out[(warm, int(seed))] = load_critic(d)
  return out


def cell_critic(cell, crit: dict) -> dict | None:
  """The pretrained critics a cell's runs started from: their readouts over seeds, or None (no critic warm start)."""
  from study import critic_warm
  names = sorted({cw for s in SEEDS if (cw := critic_warm(cell, s))})  # the seeds share the probe's critic
  got = [crit.get((cell.warm, int(n.rpartition(",critic,seed=")[2]))) for n in names]
  if not got:
    return None
  done = [g for g in got if g]
  mean = lambda k: float(np.mean([g[k] for g in done if g.get(k) is not None])) if done else None  # noqa: E731
  return {"n": len(done), "ev": mean("explained_variance"), "oracle": mean("oracle_explained_variance"),
          "ratio": mean("ratio"), "fit_seeds": sum(bool(g["fit"]) for g in done), "seeds": len(got)}


def cell_stats(exp, runs: dict, boot: int, crit: dict | None = None) -> dict:
  """label -> the cell's finished runs, missing run names and its estimates over seeds."""
  out = {}
  for cell in exp.cells:
    names = [f"{cell.name},seed={s}" for s in exp.seeds]
    done = [runs[n] for n in names if runs[n] is not None]
    vals = {k: [r[k] for r in done if r.get(k) is not None]
            for k in ("final", "auc", "tokens", "staleness", "wall", "invalid_max")}
    rl_critic = {k: [r["critic_rl"][k] for r in done if k in r.get("critic_rl", {})]
                 for k in ("explained_variance", "oracle_explained_variance")}
    out[cell.label] = {"cell": cell, "runs": done, "missing": [n for n in names if runs[n] is None], **vals,
                       "critic": cell_critic(cell, crit or {}), "critic_rl": rl_critic,
                       "final_est": stats.bootstrap_ci(vals["final"], boot),
                       "auc_est": stats.bootstrap_ci(vals["auc"], boot)}
  return out


def _ci(e) -> str:
  return "—" if e is None else f"{e.mean:.3f} [{e.lo:.3f}, {e.hi:.3f}]"


def _mean(xs, fmt="{:.3f}") -> str:
  return fmt.format(float(np.mean(xs))) if xs else "—"


def _tok(xs) -> str:
  return "—" if not xs else f"{np.mean(xs) / 1e3:.1f}k"


def _table(header, rows) -> str:
  return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                   + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def grid(exp) -> tuple[list[str], list[int]] | None:
  """(arms, horizons) when every label is '<arm> h<H>' (E1; an arm may lack some horizons), else None."""
  parts = [re.fullmatch(r"(.+) h(\d+)", c.label) for c in exp.cells]
  if not all(parts):
    return None
  # arms in order of first appearance at the horizon with the most arms
  hs = sorted({int(m[2]) for m in parts})
  widest = max(hs, key=lambda h: sum(int(m[2]) == h for m in parts))
  arms = list(dict.fromkeys([m[1] for m in parts if int(m[2]) == widest] + [m[1] for m in parts]))
  return arms, hs


def cell_table(exp, cs: dict) -> str:
  g = grid(exp)
  if g:  # arms as rows, one column group per horizon
    arms, hs = g
    header = ["arm"] + [f"h{h} {k}" for h in hs for k in ("n", "final success", "AUC")]
    def cols(label):
      if label not in cs:
        return ("—", "not in the study", "—")
      return len(cs[label]["final"]), _ci(cs[label]["final_est"]), _ci(cs[label]["auc_est"])
    rows = [[arm] + [x for h in hs for x in cols(f"{arm} h{h}")] for arm in arms]
    return _table(header, rows)
  stale = any(v for s in cs.values() for v in s["staleness"])  # E2's async cells; 0 for synchronous runs
  header = ["cell", "n", "final success", "AUC"] + (["staleness (mean)"] if stale else []) + ["tokens / run"]
  rows = [[label, len(s["final"]), _ci(s["final_est"]), _ci(s["auc_est"])]
          + ([_mean(s["staleness"], "{:.2f}")] if stale else []) + [_tok(s["tokens"])] for label, s in cs.items()]
  return _table(header, rows)


def untested_because(cs: dict, *labels) -> str | None:
  """Why a comparison cannot test its claim: a side without runs (a cell cut from this root), a
  pretrained critic below the bar, or None."""
  unrun = [lab for lab in labels if not cs[lab]["runs"]]
  if unrun:
    return "no runs of " + " and ".join(f"`{lab}`" for lab in unrun) + " in this root"
  weak = [f"`{lab}`'s critic EV {c['ev']:.2f} = {c['ratio']:.2f} x the oracle's {c['oracle']:.2f}"
          for lab in labels if (c := cs[lab]["critic"]) and c["ratio"] is not None and c["ratio"] < CRITIC_BAR]
  missing = [f"`{lab}` has no critic readout" for lab in labels
             if (c := cs[lab]["critic"]) and c["n"] == 0 and cs[lab]["runs"]]
  why = weak + missing
  return "; ".join(why) + f" (bar: {CRITIC_BAR} x the oracle's EV before RL)" if why else None


def judge(exp, cs: dict, boot: int) -> tuple[str, list[dict]]:
  """The experiment's verdict over its tested comparisons; a comparison whose critic did not
  reach the bar is "not tested" and counts neither way."""
  comps = []
  for a, b in exp.comparisons:
    comps.append({"a": a, "b": b, "final": stats.compare(cs[a]["final"], cs[b]["final"], boot),
                  "auc": stats.compare(cs[a]["auc"], cs[b]["auc"], boot), "untested": untested_because(cs, a, b)})
  tested = [c for c in comps if not c["untested"]]
  if comps and not tested:
    return "not tested", comps
  return stats.verdict([(c["final"], c["auc"]) for c in tested]), comps


def comparison_verdict(c: dict) -> str:
  if c["untested"]:
    return "not tested"
  return stats.verdict([(c["final"], c["auc"])])


def critic_table(cs: dict) -> str:
  """Every critic cell's critic: before RL (the pretrained warm start) and during RL, beside the oracle."""
  rows = []
  for label, s in cs.items():
    pre, rl = s["critic"], s["critic_rl"]
    if pre is None and not rl["explained_variance"]:
      continue
    fmt = lambda x: "—" if x is None else f"{x:.2f}"  # noqa: E731
    rows.append([label,
                 "no (vp off)" if pre is None else f"{pre['n']} of {pre['seeds']}",
                 fmt(pre and pre["ev"]), fmt(pre and pre["oracle"]), fmt(pre and pre["ratio"]),
                 "—" if pre is None else f"{pre['fit_seeds']} of {pre['n']}",
                 _mean(rl["explained_variance"], "{:.2f}"), _mean(rl["oracle_explained_variance"], "{:.2f}")])
  if not rows:
    return ""
  return ("Critics (explained variance of Monte-Carlo returns, held out; oracle = the mean return of the "
          "sessions sharing the turn and the turn-0 decision, cross-fitted, train/critic_readout.py). "
          f"\"Before RL\": the critic warm start each run started from; a critic is fit when its EV reaches "
          f"{CRITIC_BAR} x the oracle's. \"During RL\": the mean over the run's updates, scored before each "
          "update.\n\n" + _table(["cell", "pretrained critic", "EV before RL", "oracle EV", "EV / oracle",
                                   "at the bar", "EV during RL", "oracle EV during RL"], rows))


def verdict_sentence(exp, verdict: str, comps: list[dict], cs: dict) -> str:
  parts = [f"{c['a']} vs {c['b']}: " + (f"not tested ({c['untested']})" if c["untested"] else
           f"final {_ci(cs[c['a']]['final_est'])} vs {_ci(cs[c['b']]['final_est'])} ({c['final']}), "
           f"AUC {_ci(cs[c['a']]['auc_est'])} vs {_ci(cs[c['b']]['auc_est'])} ({c['auc']})") for c in comps]
  return f"**{exp.id}: {verdict}** ({exp.title}): " + "; ".join(parts) + "."


def format_check(cs: dict) -> str:
  """Which cells lost the action format on some seed (invalid actions above the bar in an update)."""
  lost = [f"`{label}` ({sum(x > INVALID_BAR for x in s['invalid_max'])} of {len(s['invalid_max'])} seeds, "
          f"worst {max(s['invalid_max']):.0%} of turns)" for label, s in cs.items()
          if s["invalid_max"] and max(s["invalid_max"]) > INVALID_BAR]
  if not lost:
    return (f"Action format: every run kept invalid actions at or below {INVALID_BAR:.0%} of turns in every "
            "update.")
  return (f"Action format lost (invalid actions above {INVALID_BAR:.0%} of turns in some update): "
          + "; ".join(lost) + ".")


def figure(exp, cs: dict, path: str) -> None:
  g = grid(exp)
  fig, ax = plt.subplots(figsize=(10 if g else 7, 4.5))
  if g or exp.figure == "bars":
    groups = [[(f"{arm} h{h}", f"h{h}") for h in g[1]] for arm in g[0]] if g else [[(k, None)] for k in cs]
    width = 0.8 / len(groups[0])
    for j in range(len(groups[0])):
      est = [cs[grp[j][0]]["final_est"] if grp[j][0] in cs else None for grp in groups]
      mean = [e.mean if e else np.nan for e in est]
      err = [[e.mean - e.lo if e else 0 for e in est], [e.hi - e.mean if e else 0 for e in est]]
      ax.bar(np.arange(len(groups)) + (j - (len(groups[0]) - 1) / 2) * width, mean, width, yerr=err, capsize=3,
             label=groups[0][j][1])
    ax.set_xticks(np.arange(len(groups)), [grp[0][0].rsplit(" h", 1)[0] if g else grp[0][0] for grp in groups],
                  rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("final eval success (mean, 95% bootstrap CI)")
    if g:
      ax.legend(title="horizon", fontsize=8)
  else:  # mean rollout success vs mean tokens, at the steps every finished seed has; band = min..max
    for label, s in cs.items():
      steps = sorted(set.intersection(*(set(r["curve"]) for r in s["runs"]))) if s["runs"] else []
      if not steps:
        continue
      t_sr = np.array([[r["curve"][st][0] for r in s["runs"]] for st in steps])
      y_sr = np.array([[r["curve"][st][1] for r in s["runs"]] for st in steps])
      line, = ax.plot(t_sr.mean(1), y_sr.mean(1), label=f"{label} (n={len(s['runs'])})")
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


def section(exp, cs: dict, verdict: str, comps: list[dict], fig_rel: str, root: str) -> str:
  done = [r for s in cs.values() for r in s["runs"]]
  missing = [n for s in cs.values() for n in s["missing"]]
  cfg = next((r["config"] for r in done if r["config"]), None)
  sizes = (f"{cfg['rl']['steps']} RL steps x {cfg['rl']['tasks_per_update']} tasks x group "
           f"{cfg['rl']['group_size']} (the runs' config.json)" if cfg
           else "sizes: see configs/study.py (no config.json found)")
  walls = [w for s in cs.values() for w in s["wall"]]
  wall = (f"{np.mean(walls) / 60:.1f} min per run, {np.sum(walls) / 3600:.2f} h in all ({len(walls)} runs timed)"
          if walls else "not recorded")
  cells = "; ".join(f"`{label}` = `{s['cell'].name}`" for label, s in cs.items())
  judged = [[f"{c['a']} > {c['b']}", _ci(cs[c["a"]]["final_est"]), _ci(cs[c["b"]]["final_est"]), c["final"],
             _ci(cs[c["a"]]["auc_est"]), _ci(cs[c["b"]]["auc_est"]), c["auc"], comparison_verdict(c)]
            for c in comps]
  crit = critic_table(cs)
  return "\n".join([
      f"## {exp.id}: {exp.title}", "",
      f"**Question.** {exp.question}", "",
      f"**Published claim.** {exp.claim} ({exp.source})", "",
      f"**Setup.** {exp.note + '. ' if exp.note else ''}Each run: `python -m mtrl_jax.main --config={CONFIG}:<cell>,seed=<s> "
      f"--workdir={root}/runs/<cell>,seed=<s> --config.init_from={root}/warm/<warm start>`; {sizes}; "
      f"seeds {', '.join(map(str, exp.seeds))}; {len(done)} runs finished, {len(missing)} missing; "
      f"{_tok([t for s in cs.values() for t in s['tokens']])} tokens per run; CPU wall time {wall}.", "",
      f"Cells: {cells}.", "",
      cell_table(exp, cs), "",
      *([crit, ""] if crit else []),
      format_check(cs), "",
      f"![{exp.id}]({fig_rel})", "",
      "Claimed comparisons (A > B), judged on each metric: A>B / B>A when the 95% intervals are disjoint, "
      f"overlap otherwise, n/a under {stats.MIN_N} seeds a side; \"not tested\" when a critic the claim "
      "relies on did not reach the bar.", "",
      _table(["claim", "final A", "final B", "final", "AUC A", "AUC B", "AUC", "verdict"], judged), "",
      verdict_sentence(exp, verdict, comps, cs), "",
      *([f"<details><summary>missing runs ({len(missing)})</summary>\n\n" + "\n".join(f"- `{m}`" for m in missing)
         + "\n\n</details>", ""] if missing else [])])


def probe_table(root: str) -> str:
  names = list(dict.fromkeys([warm_name(*p) for p in PROBES] + sorted(
      os.path.basename(d) for d in glob.glob(os.path.join(root, "warm", "*")) if os.path.isdir(d))))
  rows = []
  for name in names:
    kv = dict(p.split("=", 1) for p in name.split(",") if "=" in p)
    wd = os.path.join(root, "warm", name)
    sft = ([r for r in read_metrics(wd) if r.get("stage") == "sft" and r.get("eval/success") is not None]
           if os.path.isfile(os.path.join(wd, "metrics.jsonl")) else [])
    fmt = lambda k: "—" if sft[-1].get(k) is None else f"{sft[-1][k]:.3f}"  # noqa: E731
    status = ("built", fmt("eval/success"), fmt("eval/greedy_success")) if sft else \
        ("unfinished" if os.path.isdir(wd) else "not built", "—", "—")
    cfg = _json(os.path.join(wd, "config.json")) or {}
    steps = (cfg.get("sft") or {}).get("steps", "—")
    rows.append([kv.get("probe", name), kv.get("horizon", "—"), steps, *status])
  return _table(["probe", "horizon", "BC steps", "warm start", "sampled success", "greedy success"], rows)


def lab_plot(root: str, figdir: str, rel: str) -> str:
  """The credit-accuracy lab's agreement plot(s) and a table per lab run under ROOT/lab/."""
  pngs = sorted(glob.glob(os.path.join(root, "lab", "*", "lab", "agreement.png"))
                + glob.glob(os.path.join(root, "lab", "*", "agreement.png")))
  if not pngs:
    return ("lab plot: pending (`python experiments/study.py --root ROOT --lab` runs "
            "`python -m mtrl_jax.lab.credit_accuracy` on E1's long-horizon warm start)")
  out = []
  for p in pngs:
    run = os.path.relpath(p, os.path.join(root, "lab")).split(os.sep)[0]
    name = f"lab_{run}.png"
    shutil.copyfile(p, os.path.join(figdir, name))
    out.append(f"![lab {run}]({rel}/{name})")
    res = _json(os.path.join(os.path.dirname(p), "result.json"))
    if res and res.get("estimators"):
      far = max(len(r.get("agreement_by_distance") or []) for r in res["estimators"].values()) - 1
      rows = []
      critics = res.get("critics") or {}
      for est, r in res["estimators"].items():
        agr = r.get("agreement_by_distance") or []
        cq = critics.get(r.get("critic")) or {}
        rows.append([est, _num(agr[0] if agr else None), _num(agr[far] if len(agr) > far else None),
                     _num(r.get("rank_corr")), _num(r.get("bias")), _num(r.get("variance")),
                     _num(cq.get("explained_variance")), _num(cq.get("oracle_explained_variance"))])
      out.append(f"`{run}`: {res.get('sessions')} sessions, {res.get('continuations')} continuations per "
                 f"turn (env `{res.get('env')}`). Sign agreement with the Monte-Carlo ground-truth advantage "
                 f"A* where |A*| > 2 standard errors, at distance 0 (the reward's turn) and {far} turns before it "
                 f"(significant items there: {_sig(res, 0)} and {_sig(res, far)}; sampled success of the "
                 f"policy {_num(res.get('success'))}):")
      out.append(_table(["estimator", "agreement d=0", f"agreement d={far}", "rank corr", "bias", "variance",
                         "critic EV", "oracle EV"], rows))
      if critics:
        out.append("Critic EV: the explained variance of the lab's sessions' Monte-Carlo returns by the critic "
                   "the estimator reads (`mc`: value pretraining's; `coupled`: refitted on lambda 0.95 "
                   "targets), on these sessions, which no critic was fitted on; oracle EV: the closed-form "
                   "values' on the same sessions (— where the estimator reads no critic or the env declares "
                   "no values).")
      if res.get("env") == "bifurcation":
        out.append("Note: `bifurcation` draws its payoff and its noise at reset, so every continuation "
                   "from a history shares them: A* is the advantage given the episode's hidden draw. On "
                   "the distractor turns no action changes the return, so A* there is known exactly "
                   "(standard error 0) and is 0 up to float rounding; the significance test drops such "
                   "items (|A*| must also exceed 1e-6), so the turn-0 choice (the farthest distance) "
                   "carries the measurement.")
  return "\n\n".join(out)


def critic_warm_table(crit: dict) -> str:
  """One row per critic warm start: the pretrained critic against the oracle, and the bar."""
  if not crit:
    return "No critic warm start in this root."
  fmt = lambda x: "—" if x is None else f"{x:.3f}"  # noqa: E731
  rows = []
  for (warm, seed), r in sorted(crit.items()):
    kv = dict(p.split("=", 1) for p in warm.split(",") if "=" in p)
    if r is None:
      rows.append([kv.get("probe"), kv.get("horizon"), seed, "unfinished", "", "", "", "", "", ""])
      continue
    rows.append([kv.get("probe"), kv.get("horizon"), seed, r.get("critic_steps"), fmt(r["explained_variance"]),
                 fmt(r["oracle_explained_variance"]), fmt(r["ratio"]), fmt(r["decision_gap"]),
                 fmt(r["oracle_decision_gap"]), "yes" if r["fit"] else "**no**"])
  return (f"Value pretraining (train/value_pretrain.py) of the critic each critic arm starts RL with, scored "
          f"on a fresh held-out batch after the last fit: explained variance of Monte-Carlo returns, the "
          f"oracle critic's on the same batch, their ratio (bar: {CRITIC_BAR}), and the value gap between the "
          f"two turn-0 decisions (critic vs oracle; an arm-blind critic has a gap near 0).\n\n"
          + _table(["probe", "horizon", "seed", "critic steps", "EV", "oracle EV", "EV / oracle", "decision gap",
                    "oracle gap", "at the bar"], rows))


def _sig(res: dict, d: int):
  counts = res.get("significant_by_distance") or []
  return counts[d] if d < len(counts) else "?"


def _num(x) -> str:
  return "—" if x is None else f"{x:.2f}"


PROTOCOL = """**Setup, and what was tuned.** Every RL cell: the 2-layer d=64 byte model, 32 updates of 8 tasks x 4
sessions, one minibatch, PPO clip 0.2 / 0.28, sampled at temperature 1, from its probe's warm start (600 steps
of behaviour cloning on 1000 quality-0.5 demos), a format penalty of 0.1 per invalid reply in RL. One learning
rate for every arm, rl.lr = 5e-4, chosen from pilots on bifurcation h8 at seeds 100 and 101 (not study seeds)
with grpo, gae_lambda0.95 and gae_lambda1: at 2e-3 and 1e-3 the policy lost the action format within 16
updates (invalid replies up to 84% of turns without the penalty); at 5e-4 and 7e-4 with 32 updates eval success
rose from 0.59-0.69 to 0.77-0.84 and most runs kept invalid replies under 7% of turns. The critic arms share one
critic recipe: a separate trunk initialised from the policy (critic lr 1e-3) and, with value pretraining on,
the probe's one pretrained critic (value pretraining of 160 critic steps on Monte-Carlo targets of the warm
start's sessions, 20 rounds of 32 tasks x 4 sessions, an optimiser of its own; every seed starts RL from it,
as every seed starts from the one policy warm start). The length-adaptive arm uses alpha = 2 (lambda = 1 -
1/(alpha l) ~ 0.98 at the ~26 action tokens of a bifurcation h8 session; VAPO's alpha 0.05 targets outputs of
thousands of tokens and would give 0.23 here): chosen for the regime, not tuned. Nothing else was tuned, per
method or at all. return_to_go uses gamma 0.9 (discounting over turns is its point); tree forks at turn 0 into 2
(the 4 sessions of a task are 2 trees of 2 leaves). In the session layout ms_grpo credits every turn with the
session's return, which is what grpo does: the two arms coincide there, and E5 compares the per-turn layouts."""


def cost(root: str, runs: dict) -> str:
  """What the finished runs and warm starts took, from their wall.json (written by study.py)."""
  run_s = [r["wall"] for r in runs.values() if r and r.get("wall")]
  warm_s = [w for w in (( _json(p) or {}).get("wall_s") for p in
                        sorted(glob.glob(os.path.join(root, "warm", "*", "wall.json")))) if w]
  total = sum(run_s) + sum(warm_s)
  return (f"**Cost.** {len(run_s)} runs took {sum(run_s) / 3600:.2f} h of wall time in all (median "
          f"{np.median(run_s) if run_s else float('nan'):.0f} s each) and {len(warm_s)} warm starts "
          f"{sum(warm_s) / 3600:.2f} h, measured two at a time on the 2-core CPU (`--parallel 2`, where two runs "
          f"share the cores): about {total / 2 / 3600:.1f} h elapsed for the whole study. Timings are inflated "
          f"by whatever else shared the machine; a run with a warm JAX compilation cache and an idle core takes "
          f"about 25 s (no critic) to 60 s (critic arms, with value pretraining).")


def _launches(root: str) -> str:
  """The study.py command lines this root was run with (ROOT/study.json), as a sentence."""
  path = os.path.join(root, "study.json")
  if not os.path.isfile(path):
    return ""
  with open(path) as f:
    argvs = list(dict.fromkeys(" ".join(json.loads(line).get("argv", [])) for line in f if line.strip()))
  cmds = "; ".join(f"`python experiments/study.py {a}`" for a in argvs)
  return f"This root was run with: {cmds}.\n\n"


def header(root: str, n_runs: int, n_missing: int, date: str) -> str:
  return f"""# The credit-assignment study

The experiments re-test published claims about credit assignment in multi-turn RL of LM agents (which
advantage estimators still credit an early decisive turn, decoupled PPO under staleness, value pretraining,
decoupled lambdas, MS-GRPO's per-turn samples, step- and turn-level credit without a critic) on small probe
tasks; E1 runs on two probes (E1: bifurcation, E1m: memory without the hint), E6 on both. Each cell is one
`{CONFIG}` argument set, run over seeds {', '.join(map(str, SEEDS))} (E6: {', '.join(map(str, E6_SEEDS))})
from the probe's shared warm start, so cells differ only in what RL does.
Final success = the last `eval` stage (64 tasks). {AUC_DEF} Intervals: 95% percentile bootstrap of the mean
over seeds (fixed RNG; one seed = the value itself). A claim "A beats B" counts as reproduced when A's interval
lies above B's on final success or on AUC and nowhere below; not reproduced when B's lies above A's on either.

{PROTOCOL}

Generated: {date}
Runs: {n_runs} finished, {n_missing} missing (of the plan: every cell x seed; missing runs are listed per experiment).

{_launches(root)}Reproduce (CPU, resumable; relaunching skips finished runs):
```bash
python experiments/study.py --root {root} --parallel 2 --probes --lab
python experiments/report.py --root {root}
```
Scale out: every run is a plain `python -m mtrl_jax.main` job, so an experiment's grid can go through
`launch/sweep.sh`, which runs `experiments/sweep.py` on every worker of a TPU VM (one process per host;
on a multi-host slice all hosts run the same sweep in lockstep and the root must be a shared folder, see
launch/README.md). Listing the grid keys in the cell-name order (probe, horizon, arm, then the varied keys)
gives the same run folders as study.py, e.g. `launch/sweep.sh --config configs/study.py --grid
'probe=bifurcation;horizon=8;arm=grpo,gae_lambda1;seed=0,1,2,3,4' --root ROOT/runs
--config.init_from=ROOT/warm/probe=bifurcation,horizon=8` after building that warm start with
`launch/run_all.sh --config={CONFIG}:probe=bifurcation,horizon=8,stage=warm
--workdir=ROOT/warm/probe=bifurcation,horizon=8`.
study.py itself has no TPU launcher, and sweep.py writes no `wall.json` (wall time then reads "not recorded")."""


def report(root: str, out: str, figdir: str, boot: int = stats.BOOT, date: str | None = None) -> dict:
  root = os.path.abspath(root)
  os.makedirs(figdir, exist_ok=True)
  rel = os.path.relpath(figdir, os.path.dirname(os.path.abspath(out)))
  names = {f"{c.name},seed={s}" for e in EXPERIMENTS for c in e.cells for s in e.seeds}
  runs = {n: load_run(os.path.join(root, "runs", n)) for n in sorted(names)}
  crit = critics(root)
  result, sections, headline = {}, [], []
  for exp in EXPERIMENTS:
    cs = cell_stats(exp, runs, boot, crit)
    if not any(s["runs"] for s in cs.values()):
      headline.append(f"- **{exp.id}** {exp.title}: not run in this study root")
      result[exp.id] = {"verdict": "not run", "cells": {}}
      continue
    verdict, comps = judge(exp, cs, boot)
    figure(exp, cs, os.path.join(figdir, f"{exp.id}.png"))
    sections.append(section(exp, cs, verdict, comps, f"{rel}/{exp.id}.png", root))
    tested = [c for c in comps if not c["untested"]]
    won = sum("A>B" in (c["final"], c["auc"]) for c in tested)
    lost = sum("B>A" in (c["final"], c["auc"]) for c in tested)
    unrun = sum(c["untested"].startswith("no runs") for c in comps if c["untested"])
    weak = len(comps) - len(tested) - unrun
    headline.append(f"- **{exp.id}** {exp.title}: **{verdict}** ({won} of {len(tested)} tested comparisons "
                    f"won on final success or AUC, {lost} reversed"
                    + (f"; {weak} not tested: critic below the bar" if weak else "")
                    + (f"; {unrun} not run: a cell cut from this root" if unrun else "") + ")")
    result[exp.id] = {"verdict": verdict, "comparisons": {f"{c['a']} > {c['b']}": comparison_verdict(c)
                                                          for c in comps}, "cells": {label: {
        "n": len(s["final"]), "final": s["final_est"].mean if s["final_est"] else None,
        "final_ci": [s["final_est"].lo, s["final_est"].hi] if s["final_est"] else None,
        "auc": s["auc_est"].mean if s["auc_est"] else None} for label, s in cs.items()}}
  n_done = sum(r is not None for r in runs.values())
  date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  text = "\n\n".join([header(root, n_done, len(runs) - n_done, date),
                      "<!-- headline -->\n" + "\n".join(headline) + "\n<!-- /headline -->",
                      cost(root, runs),
                      "## Probe tasks: how often the warm start already succeeds\n\n" + probe_table(root),
                      "## The critics before RL\n\n" + critic_warm_table(crit),
                      "## Credit-accuracy lab\n\n" + lab_plot(root, figdir, rel), *sections])
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    f.write(text.rstrip() + "\n")
  return {"experiments": result, "runs": n_done, "missing": len(runs) - n_done}


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", required=True, help="the study root (experiments/study.py --root)")
  p.add_argument("--out", default="docs/STUDY.md")
  p.add_argument("--figdir", default="docs/study")
  p.add_argument("--boot", type=int, default=stats.BOOT, help="bootstrap resamples")
  a = p.parse_args(argv)
  if not os.path.isdir(a.root):
    p.error(f"--root {a.root} is not a folder")
  result = report(a.root, a.out, a.figdir, a.boot)
  print(a.out)
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
