"""docs/STUDY.md is what the study's report (experiments/study/report.py) makes of the committed records in docs/study/.

The study's verdicts live in per-run records in the repo; STUDY.md is generated from them. This test
regenerates it from those records alone (into a temporary folder, with the committed file's date line)
and compares the two byte for byte, so a changed verdict, number, or a record added without
regenerating the report fails it. Breaks checked: one record's final success edited by 0.1 (the
cell's mean and its comparisons change), a record deleted, STUDY.md's headline edited by hand.
"""
import glob
import os
import re
import shutil

from experiments.study import report

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_study_md_regenerates_from_the_committed_records(tmp_path):
  committed = open(os.path.join(REPO, "docs", "STUDY.md")).read()
  date = re.search(r"^Generated: (.+)$", committed, re.M).group(1)
  figdir = tmp_path / "docs" / "study"
  figdir.mkdir(parents=True)
  for png in glob.glob(os.path.join(REPO, "docs", "study", "lab_*.png")):  # the lab section links these
    shutil.copy(png, figdir)
  out = tmp_path / "docs" / "STUDY.md"
  report.report(os.path.join(REPO, "docs", "study"), str(out), str(figdir), date=date, figures=False)
  assert out.read_text() == committed, "docs/STUDY.md is stale: run python -m experiments.study.report"
