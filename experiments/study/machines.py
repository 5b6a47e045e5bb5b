"""How far the machine moves round 3's numbers: the same cells and seeds recorded on two CPU kinds.

  python -m experiments.study.machines --a docs/study3 --b docs/study3_replica   # table + one JSON line

Folder A (`--a`, "round") holds the round's records (one machine), folder B (`--b`, "replica") a replica: the same runs rebuilt from their own
starts on another machine (docs/study3_replica/: an Intel Xeon, where the AMD EPYC's starts did not rebuild,
experiments/study/starts.py). Nothing here enters a verdict; it sizes what a second machine would add to a
seed's noise, which decides whether seeds made on two machines could ever be pooled.

For each run recorded in both folders (same cell, same seed): final success and AUC in each, and B - A. For
each claim of the round (round3.EXPERIMENTS' comparisons, one line per claim and seed) whose four runs are in
both: the paired difference A-side - B-side in each folder, and how far apart the two are. Beside them, the
yardsticks from folder A alone: each cell's sd over A's seeds (the seed's spread of a run) and each claim's sd
over A's seeds of its paired difference (the noise a paired test sees). The JSON line carries the means.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from experiments.study import records, round3
from experiments.study.tables import _table

METRICS = ("final", "auc")


def _metric(rec: dict, m: str) -> float | None:
  return rec["final"]["success"] if m == "final" else rec.get("auc")


def _sd(xs) -> float | None:
  xs = [x for x in xs if x is not None]
  return float(np.std(xs, ddof=1)) if len(xs) > 1 else None


def _mean(xs) -> float | None:
  xs = [x for x in xs if x is not None]
  return float(np.mean(xs)) if xs else None


def machine_label(m: dict | None) -> str:
  """'Intel(R) Xeon(R) Processor (GenuineIntel 6/167), 2 cores, jaxlib 0.10.2', or 'not recorded'."""
  if not m:
    return "not recorded"
  return (f"{m.get('cpu')} ({m.get('vendor')} {m.get('family_model')}), {m.get('cores')} cores, "
          f"jaxlib {m.get('jaxlib')}")


def machines_of(recs) -> dict:
  """machine label -> how many of these run records name it."""
  out: dict = {}
  for r in recs:
    label = machine_label(r.get("machine"))
    out[label] = out.get(label, 0) + 1
  return dict(sorted(out.items()))


def compare(a_dir: str, b_dir: str, experiments=None) -> dict:
  """{"runs": [...], "claims": [...], "summary": {...}} for the records of folders `a_dir` and `b_dir`."""
  exps = round3.EXPERIMENTS if experiments is None else experiments
  a, b = records.load(a_dir)["runs"], records.load(b_dir)["runs"]
  seeds_of: dict = {}
  for cell, seed in a:
    seeds_of.setdefault(cell, []).append(seed)
  labels = {c.name: c.label for e in exps for c in e.cells}
  runs = []
  for key in sorted(set(a) & set(b), key=lambda k: (labels.get(k[0], k[0]), k[1])):
    row = {"cell": key[0], "label": labels.get(key[0], key[0]), "seed": key[1]}
    for m in METRICS:
      x, y = _metric(a[key], m), _metric(b[key], m)
      row[m] = {"a": x, "b": y, "b_minus_a": None if x is None or y is None else y - x,
                "seed_sd_a": _sd(_metric(a[(key[0], s)], m) for s in seeds_of[key[0]])}
    runs.append(row)
  claims, seen = [], set()
  for exp in exps:
    for la, lb in exp.comparisons:
      ca, cb = exp.cell(la).name, exp.cell(lb).name
      if (ca, cb) in seen:
        continue
      seen.add((ca, cb))
      both_a = sorted(set(seeds_of.get(ca, [])) & set(seeds_of.get(cb, [])))
      for s in sorted(s for s in both_a if (ca, s) in b and (cb, s) in b):
        row = {"claim": f"{la} > {lb}", "seed": s}
        for m in METRICS:
          da = _metric(a[(ca, s)], m) - _metric(a[(cb, s)], m)
          db = _metric(b[(ca, s)], m) - _metric(b[(cb, s)], m)
          row[m] = {"a": da, "b": db, "b_minus_a": db - da,
                    "seed_sd_a": _sd(_metric(a[(ca, t)], m) - _metric(a[(cb, t)], m) for t in both_a)}
        claims.append(row)
  summary = {"a": a_dir, "b": b_dir, "runs": len(runs), "claim_seeds": len(claims),
             "machines_a": machines_of(a.values()), "machines_b": machines_of(b.values())}
  for kind, rows in (("run", runs), ("claim", claims)):
    for m in METRICS:
      summary[f"{kind}_{m}_mean_abs_b_minus_a"] = _mean(abs(r[m]["b_minus_a"]) for r in rows
                                                        if r[m]["b_minus_a"] is not None)
      summary[f"{kind}_{m}_mean_b_minus_a"] = _mean(r[m]["b_minus_a"] for r in rows)
      summary[f"{kind}_{m}_mean_seed_sd_a"] = _mean(r[m]["seed_sd_a"] for r in rows)
  return {"runs": runs, "claims": claims, "summary": summary}


def _f(x) -> str:
  return "—" if x is None else f"{x:+.3f}"


def markdown(got: dict) -> str:
  """The two tables (runs, claims) and a line of means."""
  run_rows = [[f"`{r['label']}`", r["seed"], *(v for m in METRICS for v in (
      f"{r[m]['a']:.3f}", f"{r[m]['b']:.3f}", _f(r[m]["b_minus_a"]),
      "—" if r[m]["seed_sd_a"] is None else f"{r[m]['seed_sd_a']:.3f}"))] for r in got["runs"]]
  claim_rows = [[f"`{r['claim']}`", r["seed"], *(v for m in METRICS for v in (
      _f(r[m]["a"]), _f(r[m]["b"]), _f(r[m]["b_minus_a"]),
      "—" if r[m]["seed_sd_a"] is None else f"{r[m]['seed_sd_a']:.3f}"))] for r in got["claims"]]
  head = [f"{m} {w}" for m in ("final", "AUC") for w in ("round", "replica", "replica - round",
                                                          "sd over the round's seeds")]
  s = got["summary"]
  means = (f"Means over {s['runs']} runs: |replica - round| final {s['run_final_mean_abs_b_minus_a']:.3f}, AUC "
           f"{s['run_auc_mean_abs_b_minus_a']:.3f}; a cell's sd over the round's seeds final "
           f"{s['run_final_mean_seed_sd_a']:.3f}, AUC {s['run_auc_mean_seed_sd_a']:.3f}." if s["runs"] else
           "No run is in both folders.")
  if s["claim_seeds"]:
    means += (f" Over {s['claim_seeds']} claim x seed pairs: |replica - round| of the paired difference A - B, "
              f"final {s['claim_final_mean_abs_b_minus_a']:.3f}, AUC {s['claim_auc_mean_abs_b_minus_a']:.3f}; its sd "
              f"over the round's seeds final {s['claim_final_mean_seed_sd_a']:.3f}, AUC {s['claim_auc_mean_seed_sd_a']:.3f}.")
  said = "; ".join(f"{w}: " + ", ".join(f"{k} ({n} runs)" for k, n in s[f"machines_{x}"].items())
                   for w, x in (("round", "a"), ("replica", "b")))
  return "\n\n".join([f"Machines (the run records' `machine`): {said}.", means, _table(["cell", "seed", *head], run_rows),
                      _table(["claim A > B (its paired difference A - B)", "seed", *head], claim_rows)])


HEADER = """# Round 3 on two machines: the round's records against a replica

Generated by `python -m experiments.study.machines --a {a} --b {b} --out FILE` from the two records folders
alone (experiments/study/machines.py says what each column is). "round": the round's records; "replica": the
same cells and seeds rebuilt from their own starts on another machine. Nothing here enters a verdict.

"""


def _shown(path: str) -> str:
  rel = os.path.relpath(os.path.abspath(path), records.REPO)
  return path if rel.startswith("..") else rel


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(prog="python -m experiments.study.machines", description=__doc__.split("\n\n")[0])
  p.add_argument("--a", default=records.ROUND3_RECORDS, help="the round's records (default docs/study3)")
  p.add_argument("--b", required=True, help="the replica's records (e.g. docs/study3_replica)")
  p.add_argument("--out", default="", help="also write the tables here (docs/study3_replica/COMPARISON.md)")
  a = p.parse_args(argv)
  for d in (a.a, a.b):
    if not os.path.isdir(os.path.join(d, "runs")):
      p.error(f"{d} has no runs/ folder: give a records folder (python -m experiments.study --records DIR)")
  got = compare(a.a, a.b)
  text = markdown(got)
  if a.out:
    with open(a.out, "w") as f:
      f.write(HEADER.format(a=_shown(a.a), b=_shown(a.b)) + text + "\n")
  print(text)
  print(json.dumps(got["summary"]))
  return got


if __name__ == "__main__":
  main()
