"""Round 3's deliberately partial critics in the study's verdicts (experiments/study/verdicts.py).

A partial cell (round3.CRITICS["partial"]: value pretraining stopped at PARTIAL_RATIO) starts RL from its own
critic warm start (plan.critic_warm: `<warm>,vpr=0.3,critic,seed=0`), and its comparisons are judged on
the registered band round3.PARTIAL_BAND (0.3-0.6), not on the 0.8 bar: in the band, tested with the ratio and
its interval in the verdict; outside it, or without a critic record, not tested. Full critics keep the bar.
"""
import importlib.util
import json
import os

import pytest

from experiments.study import plan, records, round3, verdicts

_tr = importlib.util.spec_from_file_location("test_report_fixture", os.path.join(os.path.dirname(__file__),
                                                                                  "test_report.py"))
_fixture = importlib.util.module_from_spec(_tr)
_tr.loader.exec_module(_fixture)
fake_run = _fixture.fake_run

H = 8
PARTIAL = round3.gae_cell("gae_lambda0.95", H, "partial")
PARTIAL_1 = round3.gae_cell("gae_lambda1", H, "partial")
FULL = round3.gae_cell("gae_lambda0.95", H, "full")
NONE = round3.gae_cell("gae_lambda1", H, "none")


def readout(ratio: float, ends=(None, None)) -> dict:
  """Value pretraining's final readout with EV / oracle EV = `ratio` (oracle 1.0) and the ratio's ends."""
  lo, hi = ends
  r = {"explained_variance": ratio, "oracle_explained_variance": 1.0, "r2": ratio, "decision_gap": 0.3,
       "oracle_decision_gap": 0.35, "critic_steps": 40}
  if lo is not None:
    r.update(explained_variance_lo=ratio - 0.02, explained_variance_hi=ratio + 0.02, oracle_explained_variance_lo=0.97,
             oracle_explained_variance_hi=1.03, ev_over_oracle_lo=lo, ev_over_oracle_hi=hi, readout_sessions=2048)
  return r


def critic_of(tmp_path, cell, r: dict) -> dict:
  """The critic record records.critic_record writes for `cell`'s critic warm start, from a final readout line."""
  name = plan.critic_warm(cell, 0)
  d = tmp_path / name
  d.mkdir()
  line = {"step": 9, "stage": "value_pretrain", "value_pretrain/final": 1.0,
          **{f"value_pretrain/{k}": v for k, v in r.items()}}
  (d / "metrics.jsonl").write_text(json.dumps(line) + "\n")
  return records.critic_record(str(d), name, prov={"commit": "test"})


def crit(tmp_path, *pairs) -> dict:
  """records.load's critics of the (cell, readout) pairs, written and read back as the study does."""
  out = tmp_path / "records"
  for cell, r in pairs:
    records.write(str(out), critic_of(tmp_path, cell, r))
  return records.load(str(out))["critics"]


def cs_of(crits: dict, **cells) -> dict:
  return {lab: {"cell": c, "recs": {0: {}}, "critic": verdicts.cell_critic(c, crits)} for lab, c in cells.items()}


def test_a_partial_cell_reads_its_own_critic_not_the_probes_full_one(tmp_path):
  """A full (0.90) and a partial (0.50) critic record of the same probe: the partial cell reads 0.50, the full
  cell 0.90, through the names records.critic_record writes and records.load keys.

  Break checked: the old lookup crit.get((cell.warm, seed)) (the `vpr` dropped) gives the partial cell the
  full critic's 0.90."""
  crits = crit(tmp_path, (FULL, readout(0.90, (0.88, 0.92))), (PARTIAL, readout(0.50, (0.47, 0.53))))
  assert len(crits) == 2
  assert verdicts.cell_critic(PARTIAL, crits)["ratio"] == pytest.approx(0.50)
  assert verdicts.cell_critic(PARTIAL, crits)["partial"]
  assert verdicts.cell_critic(FULL, crits)["ratio"] == pytest.approx(0.90)
  assert not verdicts.cell_critic(FULL, crits)["partial"]


def test_a_partial_critic_in_the_band_is_tested_and_its_interval_said(tmp_path):
  """Point ratio 0.54 [0.53, 0.56]: wholly below the 0.8 bar, inside the band 0.3-0.6: tested, the
  verdict's note says the ratio and its interval; no 'critic uncertain' note.

  Break checked: the bar applied to partial critics (the `partial` split removed from untested_because) makes
  it 'not tested (... (bar: 0.8 x the oracle's EV before RL))'; partial_note never set leaves no note."""
  cs = cs_of(crit(tmp_path, (PARTIAL, readout(0.54, (0.53, 0.56)))), A=PARTIAL)
  assert verdicts.untested_because(cs, "A") is None
  assert verdicts.untested_because(cs, "A", uncertain=True) is None
  assert verdicts.partial_note(cs, "A") == (
      "`A`'s partial critic read 0.54 [95% 0.53, 0.56] x the oracle's EV, inside the registered band 0.3-0.6")


@pytest.mark.parametrize("ratio,ends", [(0.20, (0.18, 0.23)), (0.70, (0.66, 0.74)), (0.62, (0.55, 0.66))])
def test_a_partial_critic_outside_the_band_is_not_tested_with_the_words(tmp_path, ratio, ends):
  """Below (0.20) and above (0.70) the band: not tested, naming the ratio, its interval and the band. 0.62 with
  an interval reaching into the band is still outside: the point ratio decides.

  Breaks checked: the band check dropped (partial critics exempt from every rule) tests all three; the band
  judged on the interval's overlap tests 0.62 [0.55, 0.66]."""
  cs = cs_of(crit(tmp_path, (PARTIAL, readout(ratio, ends))), A=PARTIAL)
  assert verdicts.untested_because(cs, "A") == (
      f"`A`'s partial critic read {ratio:.2f} [95% {ends[0]:.2f}, {ends[1]:.2f}] x the oracle's EV, outside the "
      "registered band 0.3-0.6")
  assert verdicts.partial_note(cs, "A") is None


def test_a_partial_cell_without_a_critic_record_and_a_full_critic_below_the_bar_are_not_tested(tmp_path):
  """No record of the partial critic: not tested, said so (even with the full critic's record present). A full
  critic below the bar (0.50 [0.47, 0.53]) keeps the bar's rule and words. A vp-off cell has no critic: tested.

  Breaks checked: the band rule applied to full critics (`partial` always True) tests the full cell (0.50 is in
  the band); a partial cell with no record dropped from the reasons tests it."""
  crits = crit(tmp_path, (FULL, readout(0.50, (0.47, 0.53))))
  cs = cs_of(crits, P=PARTIAL, F=FULL, N=NONE)
  assert verdicts.untested_because(cs, "P") == "`P` has no critic record"
  assert verdicts.untested_because(cs, "F") == (
      "`F`'s critic EV 0.50 = 0.50 [95% 0.47, 0.53] x the oracle's 1.00 (bar: 0.8 x the oracle's EV before RL)")
  assert verdicts.untested_because(cs, "N") is None and cs["N"]["critic"] is None
  assert verdicts.untested_because(cs, "F", "P") == (
      "`F`'s critic EV 0.50 = 0.50 [95% 0.47, 0.53] x the oracle's 1.00 (bar: 0.8 x the oracle's EV before RL); "
      "`P` has no critic record")


def items_of(out, ratio: float, diff) -> tuple:
  """E1's two partial cells at H=8 over 8 seeds, lambda 1 ahead of lambda 0.95 by diff(seed), their critic at
  `ratio` [ratio - 0.02, ratio + 0.02]: the experiment and its tested items."""
  exp = round3.Round3Experiment("EX", "t", "q", "c", "s", (PARTIAL_1, PARTIAL), ((PARTIAL_1.label, PARTIAL.label),),
                                seeds=tuple(range(8)))
  out.mkdir()
  for s in exp.seeds:
    base = 0.5 + 0.02 * s
    records.write(str(out / "r"), fake_run(PARTIAL_1.name, s, base + diff(s)))
    records.write(str(out / "r"), fake_run(PARTIAL.name, s, base))
  records.write(str(out / "r"), critic_of(out, PARTIAL, readout(ratio, (ratio - 0.02, ratio + 0.02))))
  loaded = records.load(str(out / "r"))
  cs = verdicts.cell_stats(exp, loaded["runs"], loaded["critics"])
  return exp, verdicts.study_tests([exp], {"EX": cs})["items"]


NOTE = "`{}`'s partial critic read 0.54 [95% 0.52, 0.56] x the oracle's EV, inside the registered band 0.3-0.6"
AHEAD = lambda s: 0.1 + 0.001 * (s % 3)  # noqa: E731


def test_the_verdict_line_of_a_partial_claim_carries_the_band_note(tmp_path):
  """End to end through study_tests and comparison_verdict: two partial cells, lambda 1 ahead by 0.1 on every
  seed, their critic 0.54 in the band: reproduced, with the note; the same runs with the critic at 0.25: not
  tested, naming both sides.

  Break checked: comparison_verdict not appending critic_notes' partial note drops '(`gae_lambda1 partial h8`'s
  partial critic read ...)'; study_tests not setting partial_note, the same."""
  exp, items = items_of(tmp_path / "in", 0.54, AHEAD)
  got = verdicts.comparison_verdict(exp, items[0], items)
  assert got.startswith("reproduced"), got
  assert got.endswith(f" ({NOTE.format(PARTIAL_1.label)}; {NOTE.format(PARTIAL.label)})"), got
  exp, items = items_of(tmp_path / "below", 0.25, AHEAD)
  assert verdicts.comparison_verdict(exp, items[0], items) == (
      f"not tested (`{PARTIAL_1.label}`'s partial critic read 0.25 [95% 0.23, 0.27] x the oracle's EV, outside the "
      f"registered band 0.3-0.6; `{PARTIAL.label}`'s partial critic read 0.25 [95% 0.23, 0.27] x the oracle's EV, "
      "outside the registered band 0.3-0.6)")


def test_the_graded_rules_words_keep_the_band_note(tmp_path):
  """An unresolved partial claim (a difference of +-0.02 alternating, mean 0) under the graded rule (graded.py,
  no ladders: underpowered) keeps the band note.

  Break checked: graded.claim_verdict appending only the critic-uncertain note drops it."""
  from experiments.study import graded
  exp, items = items_of(tmp_path / "tie", 0.54, lambda s: 0.02 * (-1) ** s)
  assert graded.claim_verdict(exp, items[0], items, {}) == (
      "underpowered (no graded control of gae_lambda0.95 (full critic) ran on this probe) "
      f"({NOTE.format(PARTIAL_1.label)}; {NOTE.format(PARTIAL.label)})")
