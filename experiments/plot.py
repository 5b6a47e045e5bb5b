"""Learning curves of one or several runs: success and return vs RL steps and vs tokens.

  python -m experiments.plot --workdir /tmp/grpo                       # -> /tmp/grpo/curves.png
  python -m experiments.plot --workdir /tmp/sweep/a,/tmp/sweep/b --out cmp.png
  python -m experiments.plot --workdir '/tmp/sweep/estimator=*,horizon=6,seed=0'   # a glob: -> /tmp/sweep/curves.png

Rows: success (eval/success, eval/greedy_success, rollout/success) and return
(eval/return, eval/greedy_return, rollout/return). Columns: x = RL step and
x = `tokens_seen` (generated + prefilled), the fair axis when variants spend
different token budgets per step. One colour per run (legend = workdir
basename), one line style per metric; the final `eval` stage is a star.
"""
from __future__ import annotations

import argparse
import glob
import json
import itertools
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

ROWS = (("success", ("eval/success", "eval/greedy_success", "rollout/success")),
        ("return", ("eval/return", "eval/greedy_return", "rollout/return")))
STYLES = {"eval/success": "-", "eval/return": "-", "eval/greedy_success": "--",
          "eval/greedy_return": "--", "rollout/success": ":", "rollout/return": ":"}


def read_records(workdir: str) -> list[dict]:
  from mtrl_jax.metrics import read_metrics
  return read_metrics(workdir)


def step_tokens(rec: dict) -> float:
  """Tokens one update generated + prefilled (the token ledger's totals)."""
  return float(rec.get("ledger/tokens_generated") or 0.0) + float(rec.get("ledger/tokens_prefilled") or 0.0)


def rl_curves(records: list[dict]) -> dict:
  """Per-step view of the `rl` stage: {"step", "tokens", metric: [...]}, plus "final" (eval stage).

  Several lines may share a step (the eval line, then the update line) and are
  merged. A resumed run re-writes the steps after its last checkpoint: when the
  step goes backwards, the later (stale) steps are dropped.
  """
  by_step: dict[int, dict] = {}
  final = None
  last = -1
  for r in records:
    if r.get("stage") == "eval":
      final = r
      continue
    if r.get("stage") != "rl":
      continue
    s = int(r["step"])
    if s < last:
      by_step = {k: v for k, v in by_step.items() if k < s}
    last = s
    by_step.setdefault(s, {}).update(r)
  steps = sorted(by_step)
  tokens, seen = [], 0.0
  for s in steps:  # the step-0 eval precedes any token; tokens_seen is cumulative
    seen = by_step[s].get("tokens_seen", seen)
    tokens.append(float(seen))
  per_step = [step_tokens(by_step[s]) for s in steps]
  if not any(tokens) and any(per_step):
    print("warning: tokens_seen is absent or stays 0 although the ledger counts tokens; "
          "the token axis sums the per-step ledger instead", file=sys.stderr)
    tokens = list(itertools.accumulate(float(t) for t in per_step))
  out = {"step": steps, "tokens": tokens, "final": None}
  for _, keys in ROWS:
    for k in keys:
      pts = [(s, t, by_step[s][k]) for s, t in zip(steps, tokens) if by_step[s].get(k) is not None]
      if pts:
        out[k] = tuple(map(list, zip(*pts)))
  if final is not None:
    out["final"] = {"step": int(final["step"]), "tokens": tokens[-1] if tokens else 0.0,
                    **{k: v for k, v in final.items() if k.startswith("eval/")}}
  return out


def _labels(workdirs: list[str]) -> list[str]:
  """Basenames; where two runs share one, the parent folder is added."""
  names = [os.path.basename(os.path.normpath(w)) for w in workdirs]
  return [os.path.join(os.path.basename(os.path.dirname(os.path.normpath(w))), n)
          if names.count(n) > 1 else n for w, n in zip(workdirs, names)]


def _ema(ys: list[float], alpha: float) -> list[float]:
  if alpha <= 0:
    return ys
  out, m = [], None
  for y in ys:
    m = y if m is None else alpha * m + (1 - alpha) * y
    out.append(m)
  return out


def plot(workdirs: list[str], out: str, smooth: float = 0.0, title: str | None = None) -> str:
  runs = []
  for w, label in zip(workdirs, _labels(workdirs)):
    c = rl_curves(read_records(w))
    if not c["step"] and c["final"] is None:
      print(f"warning: no rl or eval lines in {w}/metrics.jsonl; skipped", file=sys.stderr)
      continue
    runs.append((label, c))
  if not runs:
    raise SystemExit(f"error: nothing to plot in {workdirs}")

  fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), squeeze=False)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  used = set()
  for i, (label, c) in enumerate(runs):
    color = colors[i % len(colors)]
    for row, (_, keys) in enumerate(ROWS):
      for k in keys:
        if k in c:
          steps, tokens, ys = c[k]
          ys = _ema(ys, smooth) if k.startswith("rollout/") else ys
          axes[row, 0].plot(steps, ys, STYLES[k], color=color, lw=1.5)
          axes[row, 1].plot(tokens, ys, STYLES[k], color=color, lw=1.5)
          used.add(k)
        f = c["final"]
        if f is not None and k.startswith("eval/") and f.get(k) is not None:
          axes[row, 0].plot([f["step"]], [f[k]], "*", color=color, ms=11, mec="k", mew=0.5)
          axes[row, 1].plot([f["tokens"]], [f[k]], "*", color=color, ms=11, mec="k", mew=0.5)
          used.add("final")

  for row, (name, _) in enumerate(ROWS):
    for col, xlabel in enumerate(("RL step", "tokens seen (generated + prefilled)")):
      ax = axes[row, col]
      ax.set_xlabel(xlabel)
      ax.set_ylabel(name)
      ax.grid(alpha=0.3)
    axes[row, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    if name == "success":
      for ax in axes[row]:
        ax.set_ylim(-0.03, 1.03)
  for row, (_, keys) in enumerate(ROWS):  # line styles name the metrics of their row
    handles = [Line2D([], [], ls=STYLES[k], color="k", label=k) for k in keys if k in used]
    if "final" in used:
      handles.append(Line2D([], [], ls="", marker="*", color="k", ms=10, label="final eval"))
    if handles:
      axes[row, 1].legend(handles=handles, loc="best", fontsize=8)
  run_handles = [Line2D([], [], color=colors[i % len(colors)], lw=3, label=label)
                 for i, (label, _) in enumerate(runs)]
  axes[0, 0].legend(handles=run_handles, loc="best", fontsize=8, title="run")
  fig.suptitle(title or (runs[0][0] if len(runs) == 1 else f"{len(runs)} runs"))
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out


def split_workdirs(values: list[str]) -> list[str]:
  """Comma-separated workdirs (or globs), where a workdir name may itself hold commas.

  Sweep workdirs are named `estimator=grpo,horizon=3,seed=0`, so `a,b` is read
  by longest match: at each place, the longest comma-joined piece that names
  an existing path (or a glob that matches one) is taken.
  """
  out = []
  for value in values:
    parts, i = value.split(","), 0
    while i < len(parts):
      for j in range(len(parts), i, -1):
        matches = [m for m in sorted(glob.glob(",".join(parts[i:j]))) if os.path.isdir(m)]
        if matches:
          out += [m for m in matches if m not in out]
          i = j
          break
      else:
        raise SystemExit(f"error: no workdir matches {','.join(parts[i:])!r} (from --workdir {value!r})")
  return out


def default_out(workdirs: list[str]) -> str:
  """DIR/curves.png for one run; the runs' common folder for several."""
  if len(workdirs) == 1:
    return os.path.join(workdirs[0], "curves.png")
  return os.path.join(os.path.commonpath([os.path.abspath(w) for w in workdirs]), "curves.png")


def main(argv=None) -> str:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", required=True, action="append",
                 help="a workdir, several separated by commas, or a glob; repeatable")
  p.add_argument("--out", default=None, help="PNG path (default: WORKDIR/curves.png)")
  p.add_argument("--smooth", type=float, default=0.0,
                 help="EMA factor in [0, 1) for the noisy rollout/* curves (0 = raw)")
  p.add_argument("--title", default=None)
  a = p.parse_args(argv)
  workdirs = split_workdirs(a.workdir)
  if not 0.0 <= a.smooth < 1.0:
    p.error("--smooth must be in [0, 1)")
  out = plot(workdirs, a.out or default_out(workdirs), smooth=a.smooth, title=a.title)
  print(out)
  print(json.dumps({"out": out, "runs": len(workdirs)}))
  return out


if __name__ == "__main__":
  main()
