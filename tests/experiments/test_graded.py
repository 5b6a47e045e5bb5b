"""The graded positive control's part of the report (experiments/study/graded.py), from records.

The fixture: a small round-3 experiment (round3.py's own cells and graded controls at H = 2 and 8) whose
records, 8 seeds a cell, carry per-seed numbers chosen here. Every cell is base_s = 0.6 + a seed effect
shared by all arms, plus what the table below adds; a difference that must not separate carries a zero-mean
alternating pattern of sd ~0.053 (p 0.33 at a mean loss of 0.02), one that must separate a pattern of sd
~0.005. Mean losses are exact (the patterns have mean 0).

  ladder                       q=1    q=0.5  q=0.25   q=0.1    smallest detected
  h2 gae_lambda0.95 (full)     0.20   0.10   0.02 ns  0.02 ns  0.100 at q=0.5
  h2 ms_grpo                   0.01ns 0.01ns 0.01 ns  0.01 ns  none detected
  h8 gae_lambda0.95 (full)     0.12   0.04   0.01 ns  0.01 ns  0.040 at q=0.5
  h8 ms_grpo                   0.30   0.15   0.08     0.01 ns  0.080 at q=0.25

  claim (mean difference 0, MDE set)            h2                         h8
  gae_lambda1 none > gae_lambda0.95 none        MDE 0.06: inconclusive     MDE 0.06: no difference > 0.060
  ms_grpo > trajectory grpo (critic-free)       MDE 0.06: underpowered     MDE 0.10: no difference > 0.100
  ms_grpo > gae_lambda0.95 none (both refs)     MDE 0.06: inconclusive     MDE 0.06: inconclusive (ms 0.08)
"""
import dataclasses
import json
import importlib.util
import os

import numpy as np
import pytest
from scipy import stats as sps

from experiments.study import graded, records, round3, stats
from experiments.study.plan import Cell

_tr = importlib.util.spec_from_file_location("test_report_fixture", os.path.join(os.path.dirname(__file__),
                                                                                  "test_report.py"))
_fixture = importlib.util.module_from_spec(_tr)
_tr.loader.exec_module(_fixture)
fake_critic, fake_run = _fixture.fake_critic, _fixture.fake_run

H = (2, 8)
SEED_EFFECT = np.array([0.06, -0.08, 0.1, -0.04, 0.02, -0.05, 0.07, -0.03])
ALT = np.array([1.0, -1.0] * 4)  # mean 0, sd sqrt(8/7)
WIDE, TIGHT = 0.05 * ALT, 0.005 * ALT[::-1]
LOSS = {("gae", 2): (0.20, 0.10, None, None), ("ms", 2): (None, None, None, None),
        ("gae", 8): (0.12, 0.04, None, None), ("ms", 8): (0.30, 0.15, 0.08, None)}
NOT_SEP = {("gae", 2): 0.02, ("ms", 2): 0.01, ("gae", 8): 0.01, ("ms", 8): 0.01}  # the loss of a rung that must not separate
MDE = {("gae", 2): 0.06, ("free", 2): 0.06, ("mixed", 2): 0.06, ("gae", 8): 0.06, ("free", 8): 0.10, ("mixed", 8): 0.06}


def _k(target: float, pattern=ALT) -> float:
  """The scale of `pattern` whose paired test has MDE `target` at 8 seeds."""
  return target / stats.mde(float(np.std(pattern, ddof=1)), len(pattern))


def experiment(**replace) -> round3.Round3Experiment:
  L = round3.label
  cells = tuple(c for h in H for c in (
      round3.ms_grpo_cell(h), round3.gae_cell("gae_lambda0.95", h, "full"), round3.gae_cell("gae_lambda0.95", h, "none"),
      round3.gae_cell("gae_lambda1", h, "none"), Cell(L("trajectory grpo", h), {**round3.base(h), "arm": "grpo"}),
      *round3.graded_cells(h)))
  comps = tuple(p for h in H for p in ((L("gae_lambda1", h, "none"), L("gae_lambda0.95", h, "none")),
                                       (L("ms_grpo", h), L("trajectory grpo", h)),
                                       (L("ms_grpo", h), L("gae_lambda0.95", h, "none"))))
  e = round3.Round3Experiment("EX", "graded fixture", "q?", "lambda 1 keeps the choice", "fixture", cells, comps,
                              graded=round3.graded(H))
  return dataclasses.replace(e, **replace)


def values(h: int) -> dict:
  """label -> per-seed final success (= AUC) of every fixture cell at horizon h."""
  L = round3.label
  base = 0.6 + SEED_EFFECT
  gae_none = base - _k(MDE[("mixed", h)]) * ALT[::-1]
  out = {L("ms_grpo", h): base, L("gae_lambda0.95", h, "full"): base + 0.1, L("gae_lambda0.95", h, "none"): gae_none,
         L("gae_lambda1", h, "none"): gae_none + _k(MDE[("gae", h)]) * ALT,
         L("trajectory grpo", h): base - _k(MDE[("free", h)]) * ALT}
  for kind, (arm, critic) in (("ms", ("ms_grpo", "")), ("gae", ("gae_lambda0.95", "full"))):
    ref = out[L(arm, h, critic)]
    for q, loss in zip(round3.GRADED_Q, LOSS[(kind, h)]):
      out[round3.control_label(arm, critic, q, h)] = ref - (loss + TIGHT if loss is not None else NOT_SEP[(kind, h)] + WIDE)
  return out


def write(out, exp=None, auc=None) -> dict:
  """The fixture's records; `auc` (label -> per-seed AUC) overrides a cell's AUC (else AUC = final success)."""
  exp = exp or experiment()
  vals = {k: v for h in H for k, v in values(h).items()}
  for label, v in vals.items():
    for s, x in enumerate(v):
      rec = fake_run(exp.cell(label).name, s, float(x))
      if auc and label in auc:
        rec["auc"] = float(auc[label][s])
      records.write(out, rec)
  for h in H:  # the full critic the GAE reference starts from, at the bar (no partial critic in the fixture)
    records.write(out, fake_critic(round3.gae_cell("gae_lambda0.95", h, "full").warm, 0.9, 1.0))
  return vals


@pytest.fixture
def fx(tmp_path):
  exp = experiment()
  vals = write(str(tmp_path), exp)
  got = records.load(str(tmp_path))
  from experiments.study.verdicts import cell_stats, study_tests
  cs = {exp.id: cell_stats(exp, got["runs"], got["critics"])}
  items = study_tests([exp], cs)["items"]
  lad = graded.study_ladders([exp], cs)
  return {"exp": exp, "vals": vals, "items": items, "lad": lad, "dir": str(tmp_path),
          "text": graded.graded_report(str(tmp_path), experiments=(exp,))}


def _ladder(fx, h, ref):
  return fx["lad"][(round3.gae_cell("gae_lambda0.95", h, "full").warm, ref)]


def _words(fx, a, b):
  it = next(i for i in fx["items"] if (i["a"], i["b"]) == (a, b))
  return graded.claim_verdict(fx["exp"], it, fx["items"], fx["lad"])


def test_the_ladder_tests_each_q_against_its_reference_and_takes_the_smallest_that_separated(fx):
  """h2's GAE ladder: q=1 and q=0.5 separate, q=0.25 (0.02 under sd 0.053) does not; the smallest detected
  effect is q=0.5's 0.100, not q=1's 0.200; each rung's mean loss, p and MDE equal scipy's paired t on the
  records' numbers; the printed line and table say them.

  Breaks checked: `Ladder.smallest` taking max (the largest separating effect) gives 0.200 at q=1; the
  test's sides swapped (control - reference) gives negative losses and nothing separates; a rung kept
  when it does not separate (smallest over every rung) gives q=0.25's 0.020."""
  lad = _ladder(fx, 2, graded.GAE_REFERENCE)
  assert [r.q for r in lad.rungs] == [1.0, 0.5, 0.25, 0.1]
  assert [r.separates["final"] for r in lad.rungs] == [True, True, False, False]
  best = lad.smallest("final")
  assert best.q == 0.5 and best.tests["final"][1].mean == pytest.approx(0.10, abs=1e-9)
  ref = fx["vals"]["gae_lambda0.95 full h2"]
  for r in lad.rungs:
    d = ref - fx["vals"][r.control]
    t = r.tests["final"][1]
    assert t.mean == pytest.approx(d.mean()) and t.p == pytest.approx(sps.ttest_rel(ref, fx["vals"][r.control]).pvalue)
    assert t.mde == pytest.approx(stats.mde(float(d.std(ddof=1)), 8))
  line = graded.smallest_line(lad)
  assert line.endswith("final 0.100 at q=0.5; AUC 0.100 at q=0.5") and "H=2" in line
  assert "| 0.25 | `gae_lambda0.95 full control q=0.25 h2` | final | 8 | +0.020 [" in fx["text"]
  assert "| does not separate |" in fx["text"]


def test_a_ladder_where_nothing_separates_reads_none_detected_and_its_claims_underpowered(fx):
  """h2's ms_grpo ladder: every q loses 0.01 under sd 0.053: none detected; the critic-free claim at h2
  (ms_grpo > trajectory grpo) reads underpowered, naming the reference.

  Breaks checked: `Ladder.detected` true whenever a rung was tested (not: separated) makes the claim
  'inconclusive (MDE 0.060; no graded control of ms_grpo separated on final ...)'; a rung counted in
  `Ladder.smallest` without separating gives 'final 0.010 at q=1', not 'none detected'."""
  lad = _ladder(fx, 2, graded.CRITIC_FREE_REFERENCE)
  assert not any(r.separates[m] for r in lad.rungs for m in ("final", "auc"))
  assert lad.smallest("final") is None and graded.smallest_line(lad).endswith("`ms_grpo h2`): none detected")
  assert _words(fx, "ms_grpo h2", "trajectory grpo h2") == \
      "underpowered (no graded control of ms_grpo separated on this probe)"


def test_a_ladder_with_one_paired_seed_reads_not_yet_testable_not_underpowered(tmp_path):
  """The fixture with h8's ms_grpo controls recorded at seed 0 only (an interim state: the round's runs land
  seed by seed): no rung has a paired test, so the critic-free claim at h8 reads 'not yet testable', naming
  the reference and its one paired seed, and the experiment's word skips it; h2's claim, whose ladder has 8
  paired seeds and detected nothing, still reads underpowered.

  Breaks checked: the not-yet-testable branch removed from `bound_words` reads 'underpowered (no graded
  control of ms_grpo separated on this probe)' at h8; `Ladder.most_paired` counting the reference's seeds
  (8) instead of the pairs reads underpowered too."""
  exp = experiment()
  write(str(tmp_path), exp)
  for q in round3.GRADED_Q:
    for s in range(1, 8):
      os.remove(os.path.join(str(tmp_path), "runs", exp.cell(round3.control_label("ms_grpo", "", q, 8)).name,
                             f"seed={s}.json"))
  got = records.load(str(tmp_path))
  from experiments.study.verdicts import cell_stats, study_tests
  cs = {exp.id: cell_stats(exp, got["runs"], got["critics"])}
  items = study_tests([exp], cs)["items"]
  lad = graded.study_ladders([exp], cs)
  assert lad[(round3.ms_grpo_cell(8).warm, graded.CRITIC_FREE_REFERENCE)].most_paired() == 1
  fx = {"exp": exp, "items": items, "lad": lad}
  assert _words(fx, "ms_grpo h8", "trajectory grpo h8") == (
      "not yet testable (the graded controls of ms_grpo have 1 paired seed on this probe: a paired test needs 2)")
  assert _words(fx, "ms_grpo h2", "trajectory grpo h2") == (
      "underpowered (no graded control of ms_grpo separated on this probe)")
  text = graded.graded_report(str(tmp_path), experiments=(exp,))
  assert "**EX: underpowered** (graded fixture)" in text


def test_a_claims_mde_above_the_smallest_detected_effect_bounds_it_and_below_does_not(fx):
  """h8's GAE claim, MDE 0.060 >= h8's GAE ladder's 0.040: 'no difference larger than 0.060'; h2's, MDE 0.060
  < h2's 0.100: inconclusive naming 0.100 at q=0.5; h8's critic-free claim, MDE 0.100 >= ms_grpo h8's 0.080
  (q=0.25): bounded.

  Breaks checked: the largest separating effect (Ladder.smallest with max) makes h8's GAE claim
  inconclusive (0.120 > 0.060) and h8's critic-free claim inconclusive (0.300); the ladder looked up at
  the wrong probe (the key's warm start taken from the first ladder, or from H=2 always) makes h8's GAE claim
  inconclusive (h2's 0.100) and h2's bounded (h8's 0.040); a GAE claim judged by ms_grpo's controls
  (reference_of always CRITIC_FREE_REFERENCE) makes h2's underpowered and h8's inconclusive (0.080)."""
  assert _words(fx, "gae_lambda1 none h8", "gae_lambda0.95 none h8").startswith(
      "no difference larger than 0.060 (its MDE; the design's smallest detected control effect on this probe is "
      "0.040 at q=0.5 on final, gae_lambda0.95 (full critic))")
  assert _words(fx, "gae_lambda1 none h2", "gae_lambda0.95 none h2") == (
      "inconclusive (MDE 0.060 on final; the design's smallest detected control effect on this probe is 0.100 at "
      "q=0.5, gae_lambda0.95 (full critic))")
  assert _words(fx, "ms_grpo h8", "trajectory grpo h8").startswith(
      "no difference larger than 0.100 (its MDE; the design's smallest detected control effect on this probe is "
      "0.080 at q=0.25")


def test_a_claim_between_a_gae_arm_and_a_critic_free_arm_needs_both_references(fx):
  """ms_grpo h8 > gae_lambda0.95 none h8, MDE 0.060: GAE's ladder (0.040) backs it, ms_grpo's (0.080) does not:
  inconclusive naming ms_grpo's 0.080; at h2, ms_grpo's ladder detected nothing: underpowered, naming it.

  Breaks checked: `references` returning only the B side's reference (GAE) makes h8's claim 'no difference
  larger than 0.060' and h2's 'inconclusive (MDE 0.060 on final; ... 0.100 ...)'; the underpowered check
  asking only that some reference detected (any, not every) makes h2's 'inconclusive ... no graded control
  of ms_grpo separated on final'."""
  assert graded.references(fx["exp"], "ms_grpo h8", "gae_lambda0.95 none h8") == round3.CONTROL_REFS
  assert _words(fx, "ms_grpo h8", "gae_lambda0.95 none h8") == (
      "inconclusive (MDE 0.060 on final; the design's smallest detected control effect on this probe is 0.080 at "
      "q=0.25, ms_grpo)")
  assert _words(fx, "ms_grpo h2", "gae_lambda0.95 none h2") == (
      "underpowered (no graded control of ms_grpo separated on this probe)")


def test_every_verdict_line_names_its_claim_and_each_sides_critic_state(fx):
  """A line is 'EX: `A` (critic S) > `B` (critic S): words', S as round3's plan labels the cell (none, partial,
  full; critic-free for an arm without one), checked on E1's own cells against their arguments; the
  experiment's word over the fixture's claims is underpowered (one claim is).

  Breaks checked: critic_words from the label's second word (ms_grpo h2 -> 'critic h2') fails the
  critic-free line; critic_state read from `vp` alone (partial shown as full) fails the E1 cells."""
  assert "- EX: `gae_lambda1 none h8` (critic none) > `gae_lambda0.95 none h8` (critic none): no difference" in fx["text"]
  assert "- EX: `ms_grpo h2` (critic-free) > `trajectory grpo h2` (critic-free): underpowered" in fx["text"]
  assert "**EX: underpowered** (graded fixture). Claim: lambda 1 keeps the choice" in fx["text"]
  for c in round3.experiment("E1").cells:
    f = c.full
    want = ("critic-free" if f["arm"] == "ms_grpo" else "critic none" if not f["vp"] else
            "critic partial" if f["vpr"] else "critic full")
    assert graded.critic_words(c) == want, c.label


@pytest.mark.parametrize("words, want", [
    (["reproduced", "no difference larger than 0.050 (x)", "not tested (y)"], "no difference larger than 0.050"),
    (["no difference larger than 0.050 (x)", "no difference larger than 0.090 (x)"], "no difference larger than 0.090"),
    (["inconclusive (MDE 0.010 ...)", "no difference larger than 0.050 (x)"], "inconclusive"),
    (["inconclusive (MDE 0.010 ...)", "underpowered (no graded ...)"], "underpowered"),
    (["reproduced", "reproduced (critic uncertain)"], "reproduced"),
    (["reproduced", "not reproduced"], "not reproduced"),
    (["not tested (a)"], "not tested"),
    (["not yet testable (1 paired seed)", "inconclusive (MDE 0.010 ...)"], "inconclusive"),
    (["not yet testable (1 paired seed)", "not tested (a)"], "not yet testable"),
    (["not yet testable (1 paired seed)", "no difference larger than 0.050 (x)"], "no difference larger than 0.050")])
def test_the_experiments_word_over_its_claims(words, want):
  """Breaks checked: 'no difference larger than' taking the smallest x (min) fails the second case; an
  inconclusive claim outranking an underpowered one fails the fourth; a not-yet-testable claim counted as
  tested makes [not yet testable, not tested] 'no difference (identical on every seed)'."""
  assert graded.experiment_word(words) == want


def test_the_command_reads_round_3_records_and_prints_the_graded_part(tmp_path, capsys):
  """`python -m experiments.study.graded --records R` on round 3's own plan, with records of one probe's
  ms_grpo ladder only (every other cell unrun): the ladder and its smallest effect print; the claims whose
  cells have no records read 'not tested'; nothing else is needed to run it.

  Breaks checked: main reading the default folder instead of --records (docs/study3, absent) exits with
  the usage error; the largest separating effect prints 0.300 at q=1, not 0.080 at q=0.25 (in the
  table and in the JSON line)."""
  vals = values(8)
  e2 = round3.experiment("E2")
  for label in ("ms_grpo h8", *(round3.control_label("ms_grpo", "", q, 8) for q in round3.GRADED_Q)):
    for s, x in enumerate(vals[label]):
      records.write(str(tmp_path), fake_run(e2.cell(label).name, s, float(x)))
  text = graded.main(["--records", str(tmp_path)])
  out = capsys.readouterr().out
  body, _, last = out.rstrip("\n").rpartition("\n")
  assert body + "\n" == text
  line = json.loads(last)  # the command's last line: the smallest detected effects, as numbers
  smallest = line["smallest_detected"]
  assert smallest["probe=delayed,horizon=8,cue=true ms_grpo"] == {"final": 0.08, "auc": 0.08}, line
  assert smallest["probe=delayed,horizon=8,cue=true gae_lambda0.95 full"] == "not tested", line
  assert "H=8 (ms_grpo, `ms_grpo h8`): final 0.080 at q=0.25; AUC 0.080 at q=0.25" in text
  assert "| 1 | `ms_grpo control q=1 h8` | final | 8 | +0.300 [" in text
  assert "- E2: `decoupled eta=4 h8` (critic-free) > `naive eta=4 h8` (critic-free): not tested (no records of" in text


def test_the_bound_holds_on_every_metric_the_claim_has_an_mde_on(tmp_path):
  """h8's GAE controls with their AUC equal to the reference's (final success still loses 0.12 / 0.04): no
  control separates on AUC, so h8's GAE claim (MDE 0.060 on both metrics) is not bounded: inconclusive,
  naming AUC; the ladder's line says AUC none detected.

  Break checked: the bound read on final success alone (bound_words' metrics cut to 'final') makes it
  'no difference larger than 0.060'."""
  exp = experiment()
  ref = values(8)["gae_lambda0.95 full h8"]
  write(str(tmp_path), exp, auc={round3.control_label("gae_lambda0.95", "full", q, 8): ref for q in round3.GRADED_Q})
  text = graded.graded_report(str(tmp_path), experiments=(exp,))
  assert "`gae_lambda0.95 full h8`): final 0.040 at q=0.5; AUC none detected." in text
  assert ("- EX: `gae_lambda1 none h8` (critic none) > `gae_lambda0.95 none h8` (critic none): inconclusive (MDE "
          "0.060; no graded control of gae_lambda0.95 (full critic) separated on AUC on this probe)") in text
