"""Final evaluation of every run under a sweep root, per run and mean ± std over seeds.

  python -m experiments.summarize --root /tmp/sweep [--over seed] [--json_only]

Reads ROOT/*/metrics.jsonl (workdirs named `k=v,k=v` by experiments/sweep.py).
The final numbers come from the last line of stage `eval`; a run without one
is listed as unfinished and left out of the aggregate. Prints two markdown
tables (runs; groups over the `--over` keys, std with ddof=1) and, last, one
JSON line with the same content for scripts.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

METRICS = ("eval/success", "eval/return", "eval/greedy_success")


def read_records(workdir: str) -> list[dict]:
  from mtrl_jax.metrics import read_metrics
  return read_metrics(workdir)


def parse_name(name: str) -> dict:
  """'estimator=grpo,horizon=3,seed=0' -> {'estimator': 'grpo', ...}; a plain name -> {'run': name}."""
  parts = name.split(",")
  if all("=" in p for p in parts):
    return dict(p.split("=", 1) for p in parts)
  return {"run": name}


def tokens_seen(rl: list[dict]) -> float | None:
  """The last `tokens_seen`; if that never moves, the per-step ledger counts summed over steps."""
  seen = max((r["tokens_seen"] for r in rl if r.get("tokens_seen") is not None), default=None)
  if seen:
    return seen
  per_step = {}  # step -> tokens; a resumed run's rewritten steps replace the stale ones
  for r in rl:
    gen, pre = r.get("ledger/tokens_generated"), r.get("ledger/tokens_prefilled")
    if gen is not None or pre is not None:
      per_step[int(r["step"])] = float(gen or 0.0) + float(pre or 0.0)
  return sum(per_step.values()) if per_step else seen


def collect(root: str) -> list[dict]:
  runs = []
  for name in sorted(os.listdir(root)):
    workdir = os.path.join(root, name)
    if not os.path.isfile(os.path.join(workdir, "metrics.jsonl")):
      continue
    records = read_records(workdir)
    finals = [r for r in records if r.get("stage") == "eval"]
    rl = [r for r in records if r.get("stage") == "rl"]
    run = {"name": name, "keys": parse_name(name), "finished": bool(finals),
           "rl_steps": max((int(r["step"]) for r in rl), default=0), "tokens_seen": tokens_seen(rl)}
    if finals:
      run.update({k: finals[-1][k] for k in METRICS if finals[-1].get(k) is not None})
    runs.append(run)
  return runs


def _mean_std(xs: list[float]) -> tuple[float, float | None]:
  m = sum(xs) / len(xs)
  if len(xs) < 2:
    return m, None
  return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def aggregate(runs: list[dict], over: tuple[str, ...]) -> list[dict]:
  """Finished runs grouped by every key but `over`, in first-seen order."""
  groups: dict[tuple, list[dict]] = {}
  for r in runs:
    if r["finished"]:
      key = tuple((k, v) for k, v in r["keys"].items() if k not in over)
      groups.setdefault(key, []).append(r)
  out = []
  for key, members in groups.items():
    g = {"keys": dict(key), "n": len(members), "runs": [m["name"] for m in members]}
    for k in METRICS:
      xs = [m[k] for m in members if m.get(k) is not None]
      if xs:
        g[k + "/mean"], g[k + "/std"] = _mean_std(xs)
    out.append(g)
  return out


def _f(x) -> str:
  return "—" if x is None else f"{x:.3f}"


def _tokens(x) -> str:
  if x is None:
    return "—"
  return f"{x / 1e6:.2f}M" if x >= 1e5 else f"{x:.0f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines)


def render(runs: list[dict], groups: list[dict], over: tuple[str, ...]) -> str:
  metrics = [k for k in METRICS if any(k in r for r in runs)]
  header = ["run", "status", "rl steps", "tokens"] + [k.removeprefix("eval/") for k in metrics]
  rows = [[r["name"], "final" if r["finished"] else "unfinished", str(r["rl_steps"]), _tokens(r["tokens_seen"])]
          + [_f(r.get(k)) for k in metrics] for r in runs]
  out = [_table(header, rows)]
  if groups:
    def cell(g, k):
      if g.get(k + "/mean") is None:
        return "—"
      std = g[k + "/std"]
      return _f(g[k + "/mean"]) + ("" if std is None else f" ± {std:.3f}")
    keys = list(dict.fromkeys(k for g in groups for k in g["keys"])) or ["all"]
    header = keys + ["n"] + [k.removeprefix("eval/") for k in metrics]
    rows = [[g["keys"].get(k, "all" if k == "all" else "—") for k in keys] + [str(g["n"])]
            + [cell(g, k) for k in metrics] for g in groups]
    out += ["", f"mean ± std over {', '.join(over)} (finished runs only)", "", _table(header, rows)]
  return "\n".join(out)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", required=True, help="the sweep root (one workdir per run under it)")
  p.add_argument("--over", default="seed", help="comma-separated keys to aggregate over (default: seed)")
  p.add_argument("--json_only", action="store_true", help="print only the JSON line")
  a = p.parse_args(argv)
  if not os.path.isdir(a.root):
    p.error(f"--root {a.root} is not a folder")
  over = tuple(k for k in a.over.split(",") if k)
  runs = collect(a.root)
  if not runs:
    print(f"error: no ROOT/*/metrics.jsonl under {a.root}", file=sys.stderr)
    sys.exit(1)
  groups = aggregate(runs, over)
  if not a.json_only:
    print(render(runs, groups, over))
    print()
  result = {"root": a.root, "over": list(over), "runs": runs, "groups": groups}
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
