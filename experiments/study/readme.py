"""The README's study table: one row per claim line of docs/STUDY.md's headline, nothing else.

  python -m experiments.study.readme           # rewrites the README's table from docs/STUDY.md
  python -m experiments.study.readme --check   # exit 1 when the README's table differs from the headline
  (both print one JSON line last)

A row is (experiment, claim, verdict, key number): the headline line "`A` > `B`: reproduced at H 8, 32
(final +0.030, +0.537); inconclusive at H 2 (MDE 0.008)" becomes the claim `A` > `B`, the verdict
"reproduced at H 8, 32; inconclusive at H 2" and the key numbers "final +0.030, +0.537; MDE 0.008".
An experiment without claim lines (cut, not run) is one row with its headline word.
tests/experiments/test_readme_study.py holds the README to it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

from experiments.study.records import REPO

START = "<!-- study table: python -m experiments.study.readme -->"
END = "<!-- /study table -->"
HEADER = ["experiment", "claim (A beats B)", "verdict", "key number"]


def _groups(rest: str) -> list[str]:
  """'a at H 2 (x, y); b' -> ['a at H 2 (x, y)', 'b']: split on '; ' outside parentheses."""
  return re.split(r"; (?![^()]*\))", rest)


def rows(study_md: str) -> list[list[str]]:
  """The table's rows from STUDY.md's text (its headline block)."""
  if "<!-- headline -->" not in study_md:
    raise ValueError("no <!-- headline --> block in the study text")
  head = study_md.split("<!-- headline -->", 1)[1].split("<!-- /headline -->", 1)[0]
  out, exp, has_claims = [], None, False
  lines = [x for x in head.strip().splitlines() if x.strip()]
  for i, line in enumerate(lines):
    if line.startswith("- **"):
      m = re.fullmatch(r"- \*\*(\w+)\*\* (.+?): (.+)", line)
      exp = f"{m[1]} {m[2]}"
      claims = i + 1 < len(lines) and lines[i + 1].startswith("  - ")
      if not claims:  # cut or not run: the headline's word, without its reason
        out.append([exp, "—", m[3].replace("**", "").split(" (")[0], "—"])
    else:
      claim, rest = line.strip()[2:].split(": ", 1)
      words, keys = [], []
      for g in _groups(rest):
        k = re.fullmatch(r"(.+?) \(((?:final|AUC|MDE) [^()]*)\)", g)
        words.append(k[1] if k else g)
        if k:
          keys.append(k[2])
      out.append([exp, claim, "; ".join(words), "; ".join(keys) or "—"])
  return out


def table(study_md: str) -> str:
  return "\n".join(["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
                   + ["| " + " | ".join(r) + " |" for r in rows(study_md)])


def readme_table(readme: str) -> str:
  """The table now between the README's markers."""
  if START not in readme or END not in readme:
    raise ValueError(f"the README has no {START} ... {END} block")
  return readme.split(START, 1)[1].split(END, 1)[0].strip()


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m experiments.study.readme", description=__doc__.split("\n\n")[0])
  p.add_argument("--study", default=os.path.join(REPO, "docs", "STUDY.md"))
  p.add_argument("--readme", default=os.path.join(REPO, "README.md"))
  p.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
  a = p.parse_args(argv)
  want = table(open(a.study).read())
  text = open(a.readme).read()
  if a.check:
    same = readme_table(text) == want
    print("README study table: " + ("matches the headline" if same else "differs from the headline: run "
                                    "python -m experiments.study.readme"))
    print(json.dumps({"readme": a.readme, "matches": same}))
    return 0 if same else 1
  head, rest = text.split(START, 1)
  with open(a.readme, "w") as f:
    f.write(head + START + "\n" + want + "\n" + END + rest.split(END, 1)[1])
  print(a.readme)
  print(json.dumps({"readme": a.readme, "rows": len(rows(open(a.study).read()))}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
