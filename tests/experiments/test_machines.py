"""The machine comparison (experiments/study/machines.py): the same cells and seeds recorded in two folders.

Fixture: one claim of E5 at H=2 (`ms_grpo turn history` > `trajectory grpo`), its two cells recorded at seeds
0-3 in the round's folder and at seeds 0-1 in the replica's, with per-seed numbers chosen here (final success;
AUC = final - 0.1). Each test names the break it was checked against (edits made in a scratch copy and
reverted).
"""
import json
import os

import numpy as np
import pytest

from experiments.study import machines, records, round3
from tests.experiments.test_report import fake_run

E5 = round3.experiment("E5")
A_LABEL, B_LABEL = "ms_grpo turn history h2", "trajectory grpo h2"
ROUND = {A_LABEL: [0.90, 0.80, 0.85, 0.95], B_LABEL: [0.88, 0.84, 0.80, 0.90]}
REPLICA = {A_LABEL: [0.86, 0.83], B_LABEL: [0.88, 0.79]}


MACHINE = {"cpu": "Some CPU", "vendor": "GenuineIntel", "family_model": "6/167", "cores": 2, "jaxlib": "0.10.2"}


def _write(out, values, machine=None):
  for label, xs in values.items():
    for s, x in enumerate(xs):
      rec = fake_run(E5.cell(label).name, s, x)
      rec["auc"] = x - 0.1
      if machine:
        rec["machine"] = machine
      records.write(out, rec)


@pytest.fixture
def got(tmp_path):
  a, b = str(tmp_path / "round"), str(tmp_path / "replica")
  _write(a, ROUND)
  _write(b, REPLICA)
  return machines.compare(a, b, experiments=(E5,))


def test_each_run_in_both_folders_gets_both_numbers_their_difference_and_the_rounds_seed_sd(got):
  """Four runs are in both folders (2 cells x seeds 0-1); each row holds the round's and the replica's final
  success, replica - round, and the cell's sd over the round's 4 seeds (numpy's, ddof 1); AUC the same, 0.1
  lower; the summary's mean |replica - round| over the four.

  Breaks checked: the difference taken round - replica flips every sign; the seed sd over the replica's seeds
  (2) gives other numbers; ddof 0 gives other numbers."""
  rows = {(r["label"], r["seed"]): r for r in got["runs"]}
  assert sorted(rows) == [(A_LABEL, 0), (A_LABEL, 1), (B_LABEL, 0), (B_LABEL, 1)]
  for (label, s), r in rows.items():
    assert r["final"]["a"] == ROUND[label][s] and r["final"]["b"] == REPLICA[label][s]
    assert r["final"]["b_minus_a"] == pytest.approx(REPLICA[label][s] - ROUND[label][s], abs=1e-12)
    assert r["final"]["seed_sd_a"] == pytest.approx(np.std(ROUND[label], ddof=1), abs=1e-12)
    assert r["auc"]["b_minus_a"] == pytest.approx(r["final"]["b_minus_a"], abs=1e-12)
  want = np.mean([abs(REPLICA[l][s] - ROUND[l][s]) for l in ROUND for s in (0, 1)])
  assert got["summary"]["run_final_mean_abs_b_minus_a"] == pytest.approx(want, abs=1e-12)


def test_each_claim_seed_in_both_folders_compares_its_paired_difference(got):
  """The claim at seeds 0-1: A - B in each folder (round 0.02, -0.04; replica -0.02, 0.04), replica - round,
  and the sd of the round's A - B over its 4 seeds; the printed table and the JSON summary say them.

  Breaks checked: the paired difference taken B - A flips the signs; a claim row made for a seed only the
  round has (seeds 2-3) adds rows with no replica numbers (None) and breaks the mean."""
  rows = got["claims"]
  assert [(r["claim"], r["seed"]) for r in rows] == [(f"{A_LABEL} > {B_LABEL}", 0), (f"{A_LABEL} > {B_LABEL}", 1)]
  d_round = np.array(ROUND[A_LABEL]) - np.array(ROUND[B_LABEL])
  for r, s in zip(rows, (0, 1)):
    assert r["final"]["a"] == pytest.approx(d_round[s], abs=1e-12)
    assert r["final"]["b"] == pytest.approx(REPLICA[A_LABEL][s] - REPLICA[B_LABEL][s], abs=1e-12)
    assert r["final"]["seed_sd_a"] == pytest.approx(np.std(d_round, ddof=1), abs=1e-12)
  assert got["summary"]["claim_seeds"] == 2
  text = machines.markdown(got)
  assert f"| `{A_LABEL} > {B_LABEL}` | 0 | +0.020 | -0.020 | -0.040 |" in text


def test_the_command_prints_the_tables_and_one_json_line(tmp_path, capsys):
  """`python -m experiments.study.machines --a R --b P --out F` (in process): the machines of each folder's run
  records first (the round's without a `machine` field: not recorded), the tables, then the summary as its
  last line; F holds the header and the same tables; a folder without runs/ is refused by name.

  Break checked: machines_of counting the round's records under the replica's label fails the first line."""
  a, b = str(tmp_path / "round"), str(tmp_path / "replica")
  _write(a, ROUND)
  _write(b, REPLICA, MACHINE)
  got = machines.main(["--a", a, "--b", b, "--out", str(tmp_path / "cmp.md")])
  out = capsys.readouterr().out.strip().splitlines()
  assert out[0] == ("Machines (the run records' `machine`): round: not recorded (8 runs); replica: Some CPU "
                    "(GenuineIntel 6/167), 2 cores, jaxlib 0.10.2 (4 runs).")
  assert json.loads(out[-1]) == got["summary"] and got["summary"]["runs"] == 4
  written = (tmp_path / "cmp.md").read_text()
  assert written.startswith("# Round 3 on two machines") and "\n".join(out[:-1]) in written
  with pytest.raises(SystemExit):
    machines.main(["--a", a, "--b", str(tmp_path / "nowhere")])
  assert "nowhere has no runs/ folder" in capsys.readouterr().err


def test_the_committed_comparison_regenerates_from_the_committed_records(tmp_path, capsys):
  """docs/study3_replica/COMPARISON.md is what machines.py makes of docs/study3/ and docs/study3_replica/ as
  committed, byte for byte (its seed spreads come from docs/study3/, so a round record added without
  regenerating it fails here); and every replica run record names one machine, not the round's.

  Breaks checked: one replica record's final success edited by 0.01; the file edited by hand."""
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  a, b = os.path.join(repo, "docs", "study3"), os.path.join(repo, "docs", "study3_replica")
  out = tmp_path / "COMPARISON.md"
  got = machines.main(["--a", a, "--b", b, "--out", str(out)])
  committed = open(os.path.join(b, "COMPARISON.md")).read()
  assert out.read_text() == committed, ("docs/study3_replica/COMPARISON.md is stale: run python -m "
                                        "experiments.study.machines --b docs/study3_replica --out "
                                        "docs/study3_replica/COMPARISON.md")
  assert len(got["summary"]["machines_b"]) == 1 and "not recorded" not in got["summary"]["machines_b"]
