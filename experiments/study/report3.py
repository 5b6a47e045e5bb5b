"""docs/STUDY3.md: the study's third round (round3.py's plan, issue 41) from its records in docs/study3/ alone.

  python -m experiments.study.report --round 3 [--records docs/study3] [--out docs/STUDY3.md]

The second round's report (report.py, docs/STUDY.md) is untouched; this one puts round 3's own parts
around the same pieces: each claim's paired tests and Holm family (verdicts.study_tests), its headline
line (verdicts.claim_lines, with each side's critic state: graded.critic_words), the graded control's
ladders and the bound they put on an unresolved claim (graded.py, which replaces the second round's
binary q=1 control here: the experiments' `controls` are dropped before testing, so no claim reads
"underpowered" from it), the pre-registered interaction in its own Holm family (interaction.py), and the
critics before RL (tables.critic_warm_table), the probe's warm start at its decisive turn beside the
ceiling (tables.cue_probe_table, from the warm and ceiling records). E6 reads round3.E6_REASON, TextWorld
round3.TEXTWORLD_NOTE.
Amendment 1 (kinds.py): the report pools every machine kind's records folder (round3.MACHINE_KINDS), prints each
kind's warm starts and critics, judges a cell's critic on each kind's own, and adds which kind made which seeds
with each claim's mean difference per kind.
The same records give the same STUDY3.md, byte for byte, but for the date line; the last line printed
is one JSON object with every verdict.
"""
from __future__ import annotations

import dataclasses
import datetime
import os

from experiments.study import graded, interaction, kinds, round3
from experiments.study import records as records_mod
from experiments.study.prose import cost
from experiments.study.tables import (TEST_HEADER, _table, cell_table, comparison_rows, critic_table,
                                      critic_warm_table, cue_probe_table, format_check)
from experiments.study.verdicts import cell_stats, claim_lines, identical, kind_name, study_tests
from experiments.study.versions import CodeCheck

DEFAULT_OUT = os.path.join(records_mod.REPO, "docs", "STUDY3.md")

STATS = f"""**Statistics.** As in the second round (docs/STUDY.md's statistics): a claim "A beats B" is judged on the
per-seed paired differences A - B of final success and AUC (mean, Student t 95% interval, two-sided paired t p,
MDE at power 0.8), with Holm over every claim and factor contrast of this round, both metrics. A claim is
**reproduced** when A > B on some metric after Holm and B > A on none, **not reproduced** when B > A on some
metric after Holm, **not tested** when a side has no records, its critic is below the bar (a deliberately partial critic:
outside its registered band {round3.PARTIAL_BAND[0]:g}-{round3.PARTIAL_BAND[1]:g}) or its records' code differs
beyond the allowed files. What changes: an unresolved claim is bounded by the **graded positive
control** (below), not the second round's shuffle-everything control: it may read "no difference larger than
x" (x its MDE) only where x is at or above the smallest control effect the design detected on its probe, on
every metric it has an MDE on, for every reference that judges it (a GAE-family arm by gae_lambda0.95 with the
full critic, a critic-free arm by ms_grpo, a claim between the two by both); below that it is **inconclusive**
(the design was not shown to see effects that small), **underpowered** where a judging reference's
controls detected nothing on the probe, and **not yet testable** while a judging reference's controls have
fewer than 2 seeds paired (an interim state: no paired test exists yet). Each claim line names each side's critic state at the start of RL:
none (value pretraining off), partial (stopped at {round3.PARTIAL_RATIO} of the oracle's EV), full (the bar),
or critic-free. **The pre-registered interaction** (E1's horizon x lambda under the partial critic) is its own
Holm family, separate from the claims': per seed (a_hi - b_hi) - (a_lo - b_lo), predicted > 0, tested two-sided
with the sign stated (experiments/study/interaction.py)."""


def _arm(label: str) -> str:
  """A claim side's label without its horizon ('gae_lambda1 none h8' -> 'gae_lambda1 none'), as claim_lines groups."""
  head, sep, h = label.rpartition(" h")
  return head if sep and h.isdigit() else label


def _unresolved(it: dict) -> bool:
  judged = tuple(it["judged"].values())
  return not it["untested"] and not identical(it) and "A>B" not in judged and "B>A" not in judged


def _bound_short(words: str) -> str:
  """graded.claim_verdict's words cut to the headline's: 'no difference larger than 0.060', 'inconclusive', ..."""
  return " ".join(words.split()[:5]) if words.startswith("no difference larger than") else words.split(" (")[0]


def headline_lines(exp, items: list, lad: dict) -> list[str]:
  """The experiment's claim lines: verdicts.claim_lines, each side named with its critic state, and the
  graded control's words for the horizons where the claim is unresolved."""
  groups: dict = {}
  for it in items:
    if it["exp"] == exp.id and it["kind"] == "claim":
      groups.setdefault((_arm(it["a"]), _arm(it["b"])), []).append(it)
  out = []
  for line in claim_lines(exp, items):
    key, mine = next(((k, v) for k, v in groups.items() if line.startswith(f"`{k[0]}` > `{k[1]}`: ")),
                     (None, None))
    if key is None:  # claim_lines' layout changed: say so rather than print a line without its critics
      raise ValueError(f"{exp.id}: claim line {line!r} names no claim of the experiment")
    a, b = key
    sides = (f"`{a}` ({graded.critic_words(exp.cell(mine[0]['a']))}) > "
             f"`{b}` ({graded.critic_words(exp.cell(mine[0]['b']))}): ")
    bounds: dict = {}
    for it in mine:
      if _unresolved(it):
        words = _bound_short(graded.claim_verdict(exp, it, items, lad))
        bounds.setdefault(words, []).append(exp.cell(it["a"]).full["horizon"])
    said = "; ".join(f"{w} at H {', '.join(map(str, sorted(hs)))}" for w, hs in bounds.items())
    out.append(sides + line[len(f"`{a}` > `{b}`: "):] + (f"; under the graded control: {said}" if said else ""))
  return out


def experiment_section(exp, cs: dict, items: list) -> str:
  """An experiment's cells, critics, format and paired tests (the claims' words: the graded section)."""
  mine = [i for i in items if i["exp"] == exp.id and i["kind"] != "control"]
  missing = [n for s in cs.values() for n in s["missing"]]
  crit = critic_table(cs)
  return "\n".join([
      f"## {exp.id}: {exp.title}", "",
      f"**Question.** {exp.question}", "",
      f"**Published claim.** {exp.claim} ({exp.source})", "",
      *([f"**Setup.** {exp.note}", ""] if exp.note else []),
      f"Seeds {', '.join(map(str, exp.seeds))}; {sum(len(s['recs']) for s in cs.values())} runs recorded, "
      f"{len(missing)} missing.", "",
      cell_table(exp, cs), "", *([crit, ""] if crit else []), format_check(cs), "",
      "Paired tests (A - B per seed; claims and factor contrasts in this round's Holm family):", "",
      _table(TEST_HEADER, comparison_rows(mine)), "",
      *([f"<details><summary>missing runs ({len(missing)})</summary>\n\n" + "\n".join(f"- `{m}`" for m in missing)
         + "\n\n</details>", ""] if missing else [])])


def _per_kind(got: dict, table) -> str:
  """`table` of the round's own folder's records; with more machine kinds (amendment 1), one per kind's folder."""
  if len(got["folders"]) < 2:
    return table(got)
  return "\n\n".join(f"**{kind_name(k)}** (`{k}`)\n\n" + table(g) for k, g in got["folders"].items())


def machines_section(got: dict, claims: str) -> str:
  """Amendment 1: which machine kind made which seeds, and the claims' differences per kind."""
  by = {}
  for (cell, seed), rec in got["runs"].items():
    by.setdefault((rec["_kind"], kinds.horizon_of(cell)), set()).add(seed)
  rows = [[kind_name(k), f"`{k}`", h, ", ".join(map(str, sorted(s)))] for (k, h), s in sorted(
      by.items(), key=lambda x: (list(got["folders"]).index(x[0][0]), x[0][1]))]
  return "\n".join([
      "## Machine kinds (amendment 1)", "",
      "A block (one horizon at one seed) is made on one machine kind from that kind's own starts "
      "(docs/STUDY_ROUND3.md, amendment 1); the tests above pool every kind's seeds, and a critic's state is "
      "judged on each kind's own critic. Seeds recorded, by kind:", "",
      _table(["kind", "records", "horizon", "seeds"], rows), *(["", claims] if claims else [])])


def interaction_section(tests: list[dict]) -> str:
  if not tests:
    return "## The pre-registered interaction\n\nNo experiment registered one."
  fams = dict.fromkeys(t["family"] for t in tests)
  sizes = "; ".join(f"{f}: {next(t['family_size'] for t in tests if t['family'] == f)} p-values, its tests x "
                    "final success and AUC" for f in fams)
  return "\n".join([
      "## The pre-registered interaction", "",
      f"Each family is its own Holm family ({sizes}), apart from the claims'. A test is the per-seed double "
      "difference over the seeds all four cells have, predicted > 0; its p is the two-sided paired t's (judged "
      "> 0 or < 0 by the sign of the mean where Holm p < 0.05). Reproduced: > 0 on some metric and < 0 on none; "
      "not reproduced: < 0 on some metric; else inconclusive at the largest MDE of its metrics.", "",
      _table(interaction.HEADER, interaction.rows(tests)), "",
      *(f"- {interaction.line(t)}" for t in tests)])


def header(n_done: int, n_missing: int, date: str, shown: str) -> str:
  return f"""# The credit-assignment study, third round

The third round (issue 41; the plan, pre-registered before its runs: experiments/study/round3.py, and
docs/STUDY_ROUND3.md) re-tests the claims on `delayed(cue=True)`, whose turn-0 choice is read from the
observation, at horizons {', '.join(map(str, round3.HORIZONS))}, with the critic's quality as a factor and a
graded positive control per probe. The second round's report, docs/STUDY.md, is unchanged.

{STATS}

**Data.** This file is generated from the per-run records in {shown} alone
(`python -m experiments.study.report --round 3`; schema in experiments/study/records.py).

Generated: {date}
Runs: {n_done} recorded, {n_missing} missing (of the plan: every cell x seed).

Continue the round (CPU, resumable; each finished run writes its record under its machine kind's folder, a run
already recorded is skipped), or reproduce it (`--rerun`: the recorded runs too, their records overwritten, so
`git diff docs/study3` shows what did not reproduce). Either way every start the runs begin from is first checked
against its record (experiments/study/starts.py): a start rebuilt on another CPU kind can differ, and its runs are
then not launched. Since amendment 1 (docs/STUDY_ROUND3.md) a second machine kind adds whole seed blocks from its
own starts, in its own folder (round3.MACHINE_KINDS: `--records docs/study3_xeon` on the Intel Xeon), and the
runner leaves a block another kind has begun to that kind.
```bash
python -m experiments.study --round 3 --root ROOT --parallel 2 [--records docs/study3_xeon] [--rerun]
python -m experiments.study.report --round 3
```"""


def report(records_dir: str, out: str, date: str | None = None, experiments=None, code: CodeCheck | None = None,
           also=None) -> dict:
  """Writes `out` from the records in `records_dir`; returns every verdict. `experiments`: round3.EXPERIMENTS
  unless given; `code`: the check of the records' code versions (default: round3.CODE_MAY_DIFFER, this git).
  `also`: more machine kinds' record folders to pool (amendment 1, kinds.py); by default the other kinds of
  round3.MACHINE_KINDS when `records_dir` is the round's own folder, else none."""
  dirs = kinds.pooled_dirs(records_dir, also)
  also = dirs[1:]
  exps = tuple(dataclasses.replace(e, controls=()) for e in (round3.EXPERIMENTS if experiments is None else experiments))
  code = CodeCheck(round3.CODE_MAY_DIFFER, cache=os.path.join(records_dir, "code_diffs.json"),
                   where=round3.WHERE) if code is None else code
  got = kinds.load_all(dirs=dirs)
  first = os.path.relpath(os.path.abspath(records_dir), records_mod.REPO)
  cstats = {e.id: cell_stats(e, got["runs"], got["critics"], got["kinds"] if also else None) for e in exps}
  ran = [e for e in exps if not e.cut and any(s["recs"] for s in cstats[e.id].values())]
  tests = study_tests(ran, cstats, code)
  items = tests["items"]
  lad = graded.study_ladders(ran, cstats, code)
  inter = interaction.interaction_tests([e for e in exps if not e.cut], cstats, code)
  headline, result = [], {}
  for exp in exps:
    if exp.cut:
      headline.append(f"- **{exp.id}** {exp.title}: {exp.cut}")
      result[exp.id] = {"verdict": "not tested", "why": exp.cut}
    elif exp not in ran:
      headline.append(f"- **{exp.id}** {exp.title}: not run (no records)")
      result[exp.id] = {"verdict": "not run"}
    else:
      claims = {f"{i['a']} > {i['b']}": graded.claim_verdict(exp, i, items, lad)
                for i in items if i["exp"] == exp.id and i["kind"] == "claim"}
      word = graded.experiment_word(list(claims.values()))
      lines = headline_lines(exp, items, lad)
      headline += [f"- **{exp.id}** {exp.title}: **{word}**", *(f"  - {ln}" for ln in lines)]
      result[exp.id] = {"verdict": word, "claims": claims, "lines": lines}
  headline += [f"- **Interaction** {interaction.line(t)}" for t in inter]
  headline.append(f"- **TextWorld** coin collector (issue 41 item 9): {round3.TEXTWORLD_NOTE}")
  planned = {(c.name, s) for e in exps for c in e.cells for s in e.seeds}
  n_done = len(planned & set(got["runs"]))
  if n_done < len(planned):  # the round runs over sessions: until it is whole, say what its verdicts are not
    headline.insert(0, f"- **Interim: {n_done} of {len(planned)} planned runs recorded.** The verdicts below are read "
                       "off the seeds recorded so far, not the registered tests at every planned seed: a p-value "
                       "from 2 or 3 seeds means little, and they will change as the runs land.")
  date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  shown = os.path.relpath(os.path.abspath(records_dir), records_mod.REPO)
  families = "; ".join(f"{f}: {n} p-values" for f, n in dict.fromkeys((t["family"], t["family_size"]) for t in inter))
  text = "\n\n".join([
      header(n_done, len(planned) - n_done, date, ", ".join(
          f"`{x}`" for x in [shown if not shown.startswith("..") else records_dir, *list(got["folders"])[1:]])),
      "<!-- headline -->\n" + "\n".join(headline) + "\n<!-- /headline -->",
      f"Holm families: the claims and factor contrasts, {tests['family']} p-values (their tests x final success "
      f"and AUC); the pre-registered interaction, apart: {families or 'none'}.",
      cost({"runs": got["runs"], **{k: {(rel, key): r for rel, g in got["folders"].items()
                                         for key, r in g[k].items()} for k in ("critics", "warm")}}),
      "## The code behind the records\n\n" + code.section(got),
      "## The probe: the warm start at the decisive turn and the ceiling\n\n" + _per_kind(
          got, lambda g: cue_probe_table(g["warm"], g["ceilings"], round3.probes(exps))),
      "## The critics before RL\n\n" + _per_kind(got, lambda g: critic_warm_table(g["critics"], states=True)),
      *([machines_section(got, kinds.table(ran, cstats, items, first))] if also else []),
      graded.section(ran, cstats, items, lad).rstrip(),
      interaction_section(inter),
      *(experiment_section(e, cstats[e.id], items) for e in ran),
      "## Not tested, not planned\n\n" + "\n".join(
          [f"- **{e.id}** {e.title}: {e.cut}" for e in exps if e.cut]
          + [f"- TextWorld coin collector (issue 41 item 9): {round3.TEXTWORLD_NOTE}"])])
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    f.write(text.rstrip() + "\n")
  smallest = graded.smallest_detected(lad)  # the ladders above: the records are not read twice
  by_family: dict = {}
  for t in inter:
    by_family.setdefault(t["family"], {})[interaction.name(t["cells"])] = t["verdict"]
  return {"round": 3, "experiments": result, "runs": n_done, "missing": len(planned) - n_done,
          "holm_family": tests["family"], "smallest_detected": smallest, "interactions": by_family,
          "interaction_family": {t["family"]: t["family_size"] for t in inter}}
