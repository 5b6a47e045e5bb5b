"""The study's report (experiments/study/verdicts.py, tables.py) judges the 0.8 bar on the ratio's interval
(critic EV / oracle EV) with the package's rule (mtrl_jax/train/critic_bar.py), and records.py keeps the interval's ends from value pretraining's final readout.

"yes": the interval's lower end >= 0.8; "no": its upper end < 0.8 (the comparisons relying on the
critic are not tested, the interval said); "uncertain": it straddles 0.8 (tested, the interval said).
Records without ends (written before they existed) fall back to the point ratio, marked as such.
"""
import importlib.util
import json
import os

import pytest

from experiments.study import plan as study
from experiments.study import records, report, tables, verdicts

_tr = importlib.util.spec_from_file_location("test_report_fixture", os.path.join(os.path.dirname(__file__),
                                                                                  "test_report.py"))
fixture = importlib.util.module_from_spec(_tr)
_tr.loader.exec_module(fixture)

E1 = study.experiment("E1")
CELL = E1.cell("gae_lambda0.95 h8")  # a critic arm with value pretraining on


def readout(ev, oracle, ratio_ends=None, sessions=2048):
  """A critic record's readout; `ratio_ends` None: an old record (no interval)."""
  r = {"explained_variance": ev, "oracle_explained_variance": oracle, "r2": ev, "decision_gap": 0.3,
       "oracle_decision_gap": 0.35, "critic_steps": 160}
  if ratio_ends is not None:
    r.update(explained_variance_lo=ev - 0.02, explained_variance_hi=ev + 0.02, oracle_explained_variance_lo=oracle - 0.03,
             oracle_explained_variance_hi=oracle + 0.03, ev_over_oracle_lo=ratio_ends[0],
             ev_over_oracle_hi=ratio_ends[1], readout_sessions=sessions)
  return r


def crit_of(r, warm=CELL.warm):
  return {(warm, study.CRITIC_SEED): {"schema": records.SCHEMA, "kind": "critic", "warm": warm,
                                      "seed": study.CRITIC_SEED, "commit": "test", "readout": r, "wall_s": 1.0}}


def cs_of(r):
  return {"A": {"recs": {0: {}}, "critic": verdicts.cell_critic(CELL, crit_of(r)),
                "critic_rl": {"explained_variance": [], "oracle_explained_variance": []}}}


@pytest.mark.parametrize("ends,bar", [((0.82, 0.95), "yes"), ((0.60, 0.79), "no"), ((0.70, 0.90), "uncertain"),
                                      ((0.80, 0.90), "yes")])
def test_the_bar_is_judged_on_the_ratios_interval(ends, bar):
  """The point ratio (0.36 / 0.40 = 0.9 in every case here) does not decide: the interval does.

  Break caught: the bar judged on the point ratio when an interval exists (every case reads "yes"),
  or on the wrong end ((0.70, 0.90) read "yes" on the upper end)."""
  c = verdicts.cell_critic(CELL, crit_of(readout(0.36, 0.40, ends)))
  assert c["interval"] and c["bar"] == bar
  assert (c["ratio_lo"], c["ratio_hi"]) == pytest.approx(ends)
  assert c["ratio"] == pytest.approx(0.9) and c["sessions"] == 2048
  assert c["fit_seeds"] == (bar == "yes")


def test_old_records_fall_back_to_the_point_ratio():
  """A record without ends: judged on the point ratio, and said so.

  Break caught: an old record treated as "uncertain" or crashing on the missing keys."""
  c = verdicts.cell_critic(CELL, crit_of(readout(0.36, 0.40)))
  assert not c["interval"] and c["bar"] == "yes"
  c = verdicts.cell_critic(CELL, crit_of(readout(0.02, 0.55)))
  assert c["bar"] == "no"
  why = verdicts.untested_because(cs_of(readout(0.02, 0.55)), "A")
  assert why.startswith("`A`'s critic EV 0.02 = 0.04 x the oracle's 0.55 (point ratio: the record has no interval)")


def test_no_makes_the_comparison_untested_with_the_interval_and_uncertain_leaves_it_tested():
  """Upper end below 0.8: not tested, the interval in the reason. Straddling: tested (None), and the
  verdict line's sentence (uncertain=True) says the interval.

  Break caught: "uncertain" treated as "no" (the comparison untested), or "no" decided by the point
  ratio (0.9 here: the comparison would be tested)."""
  no = cs_of(readout(0.36, 0.40, (0.60, 0.79)))
  assert verdicts.untested_because(no, "A") == ("`A`'s critic EV 0.36 = 0.90 [95% 0.60, 0.79] x the oracle's 0.40 "
                                              "(bar: 0.8 x the oracle's EV before RL)")
  assert verdicts.untested_because(no, "A", uncertain=True) is None
  maybe = cs_of(readout(0.36, 0.40, (0.70, 0.90)))
  assert verdicts.untested_because(maybe, "A") is None
  assert verdicts.untested_because(maybe, "A", uncertain=True) == (
      "`A`'s critic EV 0.36 = 0.90 [95% 0.70, 0.90] x the oracle's 0.40: the ratio's interval straddles the "
      "bar (0.8), so the critic may be below it")
  assert verdicts.untested_because(cs_of(readout(0.36, 0.40, (0.82, 0.95))), "A", uncertain=True) is None


def test_tables_say_the_intervals():
  """critic_table and critic_warm_table show each number with its interval, the sessions, and the
  judgement word; an old record is marked (point).

  Break caught: the tables still judging "at the bar" on the point ratio (the uncertain row reads yes)."""
  text = tables.critic_table(cs_of(readout(0.36, 0.40, (0.70, 0.90))))
  assert "| A | 1 of 1 | 0.36 [0.34, 0.38] | 0.40 [0.37, 0.43] | 0.90 [0.70, 0.90] | uncertain (0 of 1 seeds) | 2048 |" in text
  assert "records hold no per-session data" not in text
  old = tables.critic_table(cs_of(readout(0.36, 0.40)))
  assert "| A | 1 of 1 | 0.36 | 0.40 | 0.90 (point) | yes (1 of 1 seeds) | — |" in old
  warm = "probe=delayed,horizon=8"
  crit = {**crit_of(readout(0.36, 0.40, (0.60, 0.79)), warm), **crit_of(readout(0.36, 0.40), warm + "x")}
  text = tables.critic_warm_table(crit)
  assert ("| delayed | 8 | 0 | 160 | 2048 | 0.360 [0.340, 0.380] | 0.400 [0.370, 0.430] | 0.900 [0.600, 0.790] | "
          "0.300 | 0.350 | **no** |") in text
  assert "| 0.900 | 0.300 | 0.350 | yes (point) |" in text


def test_the_report_tests_a_comparison_whose_critic_is_uncertain(tmp_path, monkeypatch):
  """End to end on the study fixture (test_report.py), its critics given ratio intervals: straddling
  0.8 leaves E1's claims tested (the fixture's verdict), wholly below 0.8 makes them "not tested" with
  the interval in the reason.

  Break caught: cell_critic ignoring the intervals (the point ratio 0.5 / 0.55 = 0.91 tests the
  claims in the second case); comparison_verdict dropping the uncertain critic's note."""
  import dataclasses
  monkeypatch.setattr(report, "EXPERIMENTS", tuple(dataclasses.replace(e, seeds=fixture.SEEDS)
                                                   for e in study.EXPERIMENTS))
  got = {}
  for name, ends in (("uncertain", (0.75, 0.98)), ("no", (0.55, 0.78))):
    rec = tmp_path / name
    fixture.write_fixture(str(rec))
    for h in study.HORIZONS:
      records.write(str(rec), {**fixture.fake_critic(f"probe=delayed,horizon={h}", 0.5, 0.55),
                               "readout": readout(0.5, 0.55, ends)})
    got[name] = fixture.run_report(tmp_path / f"out_{name}", rec)
  res, text = got["uncertain"]
  assert res["experiments"]["E1"]["verdict"].startswith("not reproduced")  # as the fixture's: tested
  # ... and the comparison's verdict line says the critic may be below the bar (a critic-free one does not)
  comps = res["experiments"]["E1"]["comparisons"]
  assert comps["gae_lambda1 h2 > gae_lambda0.95 h2"] == (
      "not reproduced (critic uncertain: `gae_lambda1 h2`'s critic EV 0.50 = 0.91 [95% 0.75, 0.98] x the "
      "oracle's 0.55; `gae_lambda0.95 h2`'s critic EV 0.50 = 0.91 [95% 0.75, 0.98] x the oracle's 0.55: the "
      "ratio's interval straddles the bar (0.8), so the critic may be below it)")
  assert "critic uncertain" not in res["experiments"]["E6"]["verdict"]
  assert "| 0.91 [0.75, 0.98] | uncertain (0 of 1 seeds) | 2048 |" in text
  res, text = got["no"]
  assert res["experiments"]["E1"]["verdict"].startswith("not tested")
  assert "0.91 [95% 0.55, 0.78] x the oracle's 0.55" in text


def test_critic_record_keeps_the_intervals(tmp_path):
  """records.critic_record copies the ends and the session count from the final readout; None in a
  run that predates them.

  Break caught: the new fields left out of the record (the report would fall back to the point ratio)."""
  final = {"step": 21, "stage": "value_pretrain", "value_pretrain/final": 1.0,
           **{f"value_pretrain/{k}": v for k, v in readout(0.36, 0.40, (0.7, 0.9), sessions=4096).items()}}
  (tmp_path / "metrics.jsonl").write_text(json.dumps(final) + "\n")
  rec = records.critic_record(str(tmp_path), "probe=delayed,horizon=8,critic,seed=0", prov={"commit": "x"})
  r = rec["readout"]
  assert (r["ev_over_oracle_lo"], r["ev_over_oracle_hi"], r["readout_sessions"]) == (0.7, 0.9, 4096)
  assert r["oracle_explained_variance_lo"] == pytest.approx(0.37)
  old = {k: v for k, v in final.items() if not k.endswith(("_lo", "_hi", "readout_sessions"))}
  (tmp_path / "metrics.jsonl").write_text(json.dumps(old) + "\n")
  r = records.critic_record(str(tmp_path), "probe=delayed,horizon=8,critic,seed=0", prov={"commit": "x"})["readout"]
  assert r["ev_over_oracle_lo"] is None and r["readout_sessions"] is None


def test_critic_record_says_how_value_pretraining_stopped_and_round_3s_table_shows_it(tmp_path):
  """records.critic_record keeps why the stage stopped, after how many rounds and how many readouts it played
  (3: two unconfirmed bars, then the final); a stage from before the count played one. Round 3's critic table
  prints it; round 2's table stays as it was (no column).

  Breaks caught: `stop_of` reading the stop reason off the wrong key (stopped None: the column says '—');
  the readouts defaulting to 0 for an old stage (its row would say '0 readouts')."""
  final = {"step": 43, "stage": "value_pretrain", "value_pretrain/final": 1.0, "value_pretrain/rounds": 43,
           "value_pretrain/readouts": 3, "value_pretrain/stopped_at_bar": 1.0,
           **{f"value_pretrain/{k}": v for k, v in readout(0.26, 0.26, (0.99, 1.01), sessions=2048).items()}}
  (tmp_path / "metrics.jsonl").write_text(json.dumps(final) + "\n")
  name = "probe=delayed,horizon=32,cue=true,critic,seed=0"
  rec = records.critic_record(str(tmp_path), name, prov={"commit": "x"})
  assert (rec["stopped"], rec["rounds"], rec["readouts"]) == ("bar", 43, 3)
  crit = {("probe=delayed,horizon=32,cue=true", 0): rec}
  row = "| full (stopped at the bar) | bar after 43 rounds, 3 readouts | 0 |"
  assert row in tables.critic_warm_table(crit, states=True)
  assert "readouts" not in tables.critic_warm_table(crit)
  old = {k: v for k, v in final.items() if k != "value_pretrain/readouts"}
  (tmp_path / "metrics.jsonl").write_text(json.dumps(old) + "\n")
  rec = records.critic_record(str(tmp_path), name, prov={"commit": "x"})
  assert "bar after 43 rounds, 1 readout |" in tables.critic_warm_table({("probe=delayed,horizon=32,cue=true", 0): rec},
                                                                          states=True)
