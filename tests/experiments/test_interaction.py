"""Round 3's pre-registered interaction tests (experiments/study/interaction.py), from records.

The fixture: an experiment whose interaction family F holds two tests on critic-free cells (so no critic
record decides whether they are tested), `ms_grpo turn markov` (A) against `ms_grpo turn history` (B) at
H = 2, 8, 32, 8 seeds a cell. Every cell is 0.6 + a seed effect shared by all arms; per seed, A - B is

  H=2    0.02 + a small zero-mean pattern (sd ~0.01)
  H=8    H=2's + 0.10 + a tight pattern (sd ~0.005): the interaction (H8 - H2) is clearly positive
  H=32   H=2's + a wide zero-mean pattern (sd ~0.05): the interaction (H32 - H2) is null

so the double differences are known exactly. AUC is final success x 0.5 (its tests have the same p).
"""
import importlib.util
import os
import types

import numpy as np
import pytest
from scipy import stats as sps

from experiments.study import interaction, records, round3, stats
from experiments.study.plan import Cell
from experiments.study.verdicts import cell_stats, study_tests

_tr = importlib.util.spec_from_file_location("test_report_fixture", os.path.join(os.path.dirname(__file__),
                                                                                  "test_report.py"))
_fixture = importlib.util.module_from_spec(_tr)
_tr.loader.exec_module(_fixture)
fake_run = _fixture.fake_run

SEED_EFFECT = np.array([0.06, -0.08, 0.1, -0.04, 0.02, -0.05, 0.07, -0.03])
ALT = np.array([1.0, -1.0] * 4)
SMALL, TIGHT, WIDE = 0.01 * ALT[::-1], 0.005 * np.array([1.0, 1, -1, -1] * 2), 0.05 * ALT
F, G = "F horizon x context", "G another family"


def L(arm: str, h: int) -> str:
  return round3.label(f"ms_grpo turn {arm}", h)


def cells_of(hi: int) -> tuple:
  return (L("markov", hi), L("history", hi), L("markov", 2), L("history", 2))


def experiment(comparisons=(), families=((F, (cells_of(8), cells_of(32))),)) -> round3.Round3Experiment:
  cells = tuple(Cell(L(ctx, h), {**round3.base(h), "arm": "ms_grpo", "context": ctx})
                for h in (2, 8, 32) for ctx in ("markov", "history"))
  return round3.Round3Experiment("EI", "interaction fixture", "q?", "markov gains with H", "fixture", cells,
                                 tuple(comparisons), interactions=tuple(families))


def values(sign: float = 1.0) -> dict:
  """label -> per-seed final success; `sign` -1 reverses H=8's interaction."""
  base = 0.6 + SEED_EFFECT
  gap2 = 0.02 + SMALL
  return {L("history", 2): base, L("markov", 2): base + gap2,
          L("history", 8): base - 0.01, L("markov", 8): base - 0.01 + gap2 + sign * (0.10 + TIGHT),
          L("history", 32): base - 0.02, L("markov", 32): base - 0.02 + gap2 + WIDE}


def write(out: str, vals: dict, exp=None, skip=()) -> None:
  """The records of `vals` (AUC = final x 0.5), leaving out the (label, seed) pairs in `skip`."""
  exp = exp or experiment()
  for label, v in vals.items():
    for s, x in enumerate(v):
      if (label, s) in skip or (label, None) in skip:
        continue
      rec = fake_run(exp.cell(label).name, s, float(x))
      rec["auc"] = float(x) * 0.5
      records.write(out, rec)


def run_tests(out: str, exp=None, code=None) -> list[dict]:
  exp = exp or experiment()
  got = records.load(out)
  return interaction.interaction_tests([exp], {exp.id: cell_stats(exp, got["runs"], got["critics"])}, code)


def by_cells(tests: list[dict]) -> dict:
  return {(t["family"], t["cells"]): t for t in tests}


def hand_holm(ps: list[float]) -> list[float]:
  """Holm written out: the i-th smallest p times (m - i), a running max, capped at 1."""
  order = sorted(range(len(ps)), key=lambda i: ps[i])
  out, run = [0.0] * len(ps), 0.0
  for rank, i in enumerate(order):
    run = max(run, ps[i] * (len(ps) - rank))
    out[i] = min(1.0, run)
  return out


def test_the_interaction_is_the_per_seed_double_difference_with_holm_over_its_family(tmp_path):
  """H8's test: mean = the hand-computed mean of (A8 - B8) - (A2 - B2) (0.100), p = scipy's paired t of
  A8 - B8 against A2 - B2, MDE = stats.mde at its sd; Holm p = Holm written out over the family's 4 p-values
  (2 tests x final, AUC); verdicts: H8 reproduced (final +0.100), H32 inconclusive at its largest MDE.

  Breaks checked: the lo horizon's difference added instead of subtracted (double_difference) moves the
  mean to 0.140; a single difference (a_hi - b_hi) gives 0.120; the Holm step skipped (p_adj = p) fails
  the Holm p; the verdict from the unadjusted p would not change here, so Holm is checked on its number."""
  vals = values()
  write(str(tmp_path), vals)
  got = by_cells(run_tests(str(tmp_path)))
  h8, h32 = got[(F, cells_of(8))], got[(F, cells_of(32))]
  for it, hi in ((h8, 8), (h32, 32)):
    d_hi = vals[L("markov", hi)] - vals[L("history", hi)]
    d_lo = vals[L("markov", 2)] - vals[L("history", 2)]
    seeds, t = it["tests"]["final"]
    assert seeds == list(range(8))
    assert t.mean == pytest.approx(float(np.mean(d_hi - d_lo)), abs=1e-12)
    assert t.p == pytest.approx(sps.ttest_rel(d_hi, d_lo).pvalue, rel=1e-9)
    assert t.mde == pytest.approx(stats.mde(float(np.std(d_hi - d_lo, ddof=1)), 8))
    assert it["tests"]["auc"][1].mean == pytest.approx(0.5 * float(np.mean(d_hi - d_lo)), abs=1e-12)
  assert h8["tests"]["final"][1].mean == pytest.approx(0.10, abs=1e-12)
  ps = [it["tests"][m][1].p for it in (h8, h32) for m in ("final", "auc")]
  want = hand_holm(ps)
  assert [it["p_adj"][m] for it in (h8, h32) for m in ("final", "auc")] == pytest.approx(want, rel=1e-9)
  assert h8["family_size"] == h32["family_size"] == 4
  assert h8["verdict"] == "reproduced" and interaction.line(h8).endswith("> 0: reproduced (final +0.100)")
  mde32 = max(h32["tests"][m][1].mde for m in ("final", "auc"))
  assert h32["verdict"] == f"inconclusive (MDE {mde32:.3f})" and h32["judged"] == {"final": "n.s.", "auc": "n.s."}


def test_the_interaction_family_is_its_own_holm_family(tmp_path):
  """A claim added to the experiment, or a second interaction family G with a test of tiny p, leaves F's
  adjusted p-values as they were; the claims' Holm family (verdicts.study_tests) counts the claim only.

  Breaks checked: Holm run once over every family's tests (the slots collected across families, adjusted
  after the loop) changes F's p_adj when G is added; the claims' paired tests pooled into the interaction's
  Holm (the experiment's comparisons tested and their p-values adjusted with F's) changes them when the
  claim is added."""
  write(str(tmp_path), values())
  base = by_cells(run_tests(str(tmp_path)))
  claim = (L("markov", 8), L("history", 8))
  with_claim = by_cells(run_tests(str(tmp_path), experiment(comparisons=(claim,))))
  with_g = by_cells(run_tests(str(tmp_path), experiment(families=((F, (cells_of(8), cells_of(32))), (G, (cells_of(8),))))))
  for key, it in base.items():
    assert with_claim[key]["p_adj"] == it["p_adj"] and with_claim[key]["family_size"] == 4
    assert with_g[key]["p_adj"] == it["p_adj"] and with_g[key]["family_size"] == 4
  g = with_g[(G, cells_of(8))]
  assert g["family_size"] == 2 and g["p_adj"]["final"] == pytest.approx(min(1.0, 2 * g["tests"]["final"][1].p))
  exp = experiment(comparisons=(claim,))
  got = records.load(str(tmp_path))
  assert study_tests([exp], {exp.id: cell_stats(exp, got["runs"], got["critics"])})["family"] == 2


def test_a_reversed_interaction_is_not_reproduced(tmp_path):
  """H8's A - B falls by 0.10 from H2's: the double difference is -0.100 after Holm: not reproduced.

  Break checked: the verdict read from |mean| (reproduced whenever Holm p < 0.05) calls it reproduced."""
  write(str(tmp_path), values(sign=-1.0))
  h8 = by_cells(run_tests(str(tmp_path)))[(F, cells_of(8))]
  assert h8["judged"] == {"final": "B>A", "auc": "B>A"}
  assert h8["verdict"] == "not reproduced" and interaction.line(h8).endswith("> 0: not reproduced (final -0.100)")


def test_a_missing_cell_or_seed_or_code_refusal_says_not_tested_and_why(tmp_path):
  """No records of `ms_grpo turn history h2` (every test's lo side): both tests 'not tested (no records of
  ...)', nothing in the family; one seed of H32's A missing: H32 is tested on the 7 seeds all four cells
  have, H8 on 8; one seed left in all four cells: not tested, saying so; a code check refusing the records:
  not tested with its reason. E1's own registered interaction, with no records: not tested, naming its cells.

  Breaks checked: untested_because asked about the hi cells only (a_hi, b_hi) says '0 seeds with records
  of all four cells' instead of naming the cell without records; the two differences paired by position
  (cut to the shorter) instead of by seed gives seeds 0-6 and another mean on H32; a refusal from `code`
  ignored tests the refused records."""
  vals = values()
  write(str(tmp_path / "a"), vals, skip={(L("history", 2), None)})
  for it in run_tests(str(tmp_path / "a")):
    assert it["verdict"] == "not tested (no records of `ms_grpo turn history h2`)" and it["tests"] == {}
    assert it["family_size"] == 0
  write(str(tmp_path / "b"), vals, skip={(L("markov", 32), 3)})
  got = by_cells(run_tests(str(tmp_path / "b")))
  keep = [0, 1, 2, 4, 5, 6, 7]
  assert got[(F, cells_of(32))]["tests"]["final"][0] == keep
  d = (vals[L("markov", 32)] - vals[L("history", 32)] - vals[L("markov", 2)] + vals[L("history", 2)])[keep]
  assert got[(F, cells_of(32))]["tests"]["final"][1].mean == pytest.approx(float(d.mean()), abs=1e-12)
  assert got[(F, cells_of(8))]["tests"]["final"][0] == list(range(8))
  write(str(tmp_path / "c"), vals, skip={(lab, s) for lab in vals for s in range(1, 8)})
  for it in run_tests(str(tmp_path / "c")):
    assert it["verdict"] == "not tested (1 seed with records of all four cells: a paired test needs 2)"
  write(str(tmp_path / "d"), vals)
  refuse = types.SimpleNamespace(refusal=lambda recs: "the records were made by code that differs")
  for it in run_tests(str(tmp_path / "d"), code=refuse):
    assert it["verdict"] == "not tested (the records were made by code that differs)"
  e1 = round3.experiment("E1")
  (fam, tests), = e1.interactions
  got = interaction.interaction_tests([e1], {"E1": cell_stats(e1, {}, {})})
  assert [t["cells"] for t in got] == list(tests) and fam == round3.INTERACTION_FAMILY
  assert got[0]["verdict"] == ("not tested (no records of `gae_lambda1 partial h8` and `gae_lambda0.95 partial h8` "
                               "and `gae_lambda1 partial h2` and `gae_lambda0.95 partial h2`)")


def test_identical_double_differences_read_no_difference(tmp_path):
  """H8's cells equal to H2's on every seed (both metrics): 'no difference (identical ...)', not an
  'inconclusive (MDE 0.0e+00)' from a zero sd.

  Break checked: the identical check dropped (verdict straight from stats.paired_verdict) gives
  'inconclusive (MDE unknown)'."""
  vals = values()
  vals[L("markov", 8)], vals[L("history", 8)] = vals[L("markov", 2)], vals[L("history", 2)]  # exact zeros
  exp = experiment(families=((F, (cells_of(8),)),))
  write(str(tmp_path), vals, exp)
  it, = run_tests(str(tmp_path), exp)
  assert all(t.sd == 0 for _, t in it["tests"].values()), "the fixture must give exact zeros"
  assert it["verdict"] == "no difference (identical on all 8 seeds: every double difference is 0)"
