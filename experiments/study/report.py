"""docs/STUDY.md and its figures from the study's per-run records in docs/study/ (and nothing else).

  python -m experiments.study.report [--records docs/study] [--out docs/STUDY.md] [--figdir docs/study]
  python -m experiments.study.report --round 3 [--records docs/study3] [--out docs/STUDY3.md]   # report3.py

Reads the records the study's runner writes as each job finishes (records.py:
runs/<cell>/seed=<s>.json, critics/, warm/, ceilings/): the repo alone
regenerates the report. The judgements are verdicts.py's (on stats.py's paired
per-seed differences, t intervals, Holm, MDE); tables.py and prose.py lay them
out. Prints the markdown path, then (last line) one JSON object with every
verdict. The same records give the same STUDY.md, byte for byte, but for the
date line.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os

from experiments.study import records as records_mod
from experiments.study.plan import CODE_MAY_DIFFER, EXPERIMENTS, plan
from experiments.study.prose import cost, header, old_verdicts
from experiments.study.tables import critic_warm_table, figure, lab_section, probe_table, section
from experiments.study.versions import CodeCheck
from experiments.study.verdicts import cell_stats, claim_lines, comparison_verdict, experiment_verdict, study_tests


def report(records_dir: str, out: str, figdir: str, date: str | None = None, figures: bool = True,
           experiments=None, code: CodeCheck | None = None) -> dict:
  """Writes `out` (and the figures, unless `figures` is False) from the records in `records_dir`; returns
  every verdict. `experiments`: the plan's (plan.EXPERIMENTS, read at the call) unless given; `code`: the
  check of the records' code versions (default: the plan's allowed differences, this repository's git)."""
  experiments = EXPERIMENTS if experiments is None else experiments
  code = CodeCheck(CODE_MAY_DIFFER, cache=os.path.join(records_dir, "code_diffs.json")) if code is None else code
  got = records_mod.load(records_dir)
  runs = got["runs"]
  os.makedirs(figdir, exist_ok=True)
  rel = os.path.relpath(figdir, os.path.dirname(os.path.abspath(out)))
  cstats = {e.id: cell_stats(e, runs, got["critics"]) for e in experiments}
  # A cut experiment counts as run only with records of a cell of its own (E5 shares ms_grpo h8 with E1).
  uncut = {c.name for e in experiments if not e.cut for c in e.cells}
  ran = [e for e in experiments if any(s["recs"] for s in cstats[e.id].values()
                                       if not e.cut or s["cell"].name not in uncut)]
  tests = study_tests(ran, cstats, code)
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
    claims = claim_lines(exp, items)
    headline += [f"- **{exp.id}** {exp.title}: **{verdict}**", *(f"  - {line}" for line in claims)]
    result[exp.id] = {
        "verdict": verdict, "claims": claims,
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
                      "## The code behind the records\n\n" + code.section(got),
                      "## Probe tasks: the warm start and the ceiling\n\n" + probe_table(got["warm"], got["ceilings"]),
                      "## The critics before RL\n\n" + critic_warm_table(got["critics"]),
                      "## Credit-accuracy lab\n\n" + lab_section(records_dir, figdir, rel), *sections,
                      "## The 2026-11-27 verdicts, relabelled\n\n" + old_verdicts()])
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    f.write(text.rstrip() + "\n")
  return {"experiments": result, "runs": n_done, "missing": len(planned) - n_done, "holm_family": tests["family"]}


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(prog="python -m experiments.study.report", description=__doc__.split("\n\n")[0])
  p.add_argument("--model", choices=("byte", "smol"), default="byte",
                 help="smol: the study on SmolLM2 (python -m experiments.study --model smol; its records and report apart)")
  p.add_argument("--records", default=None, help="the record folder (records.py; default docs/study, "
                                                 "docs/study_smol with --model smol)")
  p.add_argument("--out", default=None, help="default docs/STUDY.md, docs/STUDY_smol.md with --model smol")
  p.add_argument("--figdir", default=None, help="where the figures go (default: the record folder)")
  p.add_argument("--round", type=int, choices=(2, 3), default=2,
                 help="3: the third round's report (report3.py; default records docs/study3, out docs/STUDY3.md)")
  a = p.parse_args(argv)
  if a.round == 3:
    if a.model != "byte" or a.figdir:
      p.error("--round 3 is the byte model's, without figures: drop --model smol / --figdir")
    a.records = a.records or records_mod.ROUND3_RECORDS
    if not os.path.isdir(a.records):
      p.error(f"--records {a.records} is not a folder (round 3's records land in docs/study3/ as its runs finish)")
    from experiments.study import report3
    result = report3.report(a.records, a.out or report3.DEFAULT_OUT)
    print(a.out or report3.DEFAULT_OUT)
    print(json.dumps(result))
    return result
  smol = a.model == "smol"
  a.records = a.records or (records_mod.SMOL_RECORDS if smol else records_mod.DEFAULT_OUT)
  a.out = a.out or os.path.join(records_mod.REPO, "docs", "STUDY_smol.md" if smol else "STUDY.md")
  if not os.path.isdir(a.records):
    p.error(f"--records {a.records} is not a folder")
  result = report(a.records, a.out, a.figdir or a.records, experiments=plan(a.model))
  print(a.out)
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
