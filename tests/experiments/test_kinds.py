"""Round 3's amendment 1 (experiments/study/kinds.py; docs/STUDY_ROUND3.md): whole seed blocks from a second
machine kind, each from its own starts, pooled in the report with each kind's critic judged apart.

Each test names the break it was checked against (edits made in a scratch copy and reverted).
"""
import os

import pytest

from experiments.study import kinds, records, round3, runner, verdicts
from experiments.study.plan import planned_runs

H2 = "probe=delayed,horizon=2,cue=true"


def _run(out, cell: str, seed: int, final: float = 0.5) -> None:
  records.write(out, {"schema": records.SCHEMA, "kind": "run", "cell": cell, "seed": seed,
                      "final": {"success": final}, "auc": final, "rollout": {"tokens": [], "success": []}})


@pytest.fixture
def two_kinds(tmp_path, monkeypatch):
  """Two registered kinds' folders, in a repository at tmp_path (records.REPO moved there)."""
  reg = (("study3", "AMD EPYC (2 cores)"), ("study3_xeon", "Intel Xeon, 6/167 (2 cores)"))
  monkeypatch.setattr(records, "REPO", str(tmp_path))
  monkeypatch.setattr(kinds, "MACHINE_KINDS", reg)
  monkeypatch.setattr(verdicts, "MACHINE_KINDS", reg)
  return str(tmp_path / "study3"), str(tmp_path / "study3_xeon")


def test_parse_seeds_reads_a_count_a_range_and_a_list():
  """Breaks checked: 'A-B' read without its end (range(lo, hi)) gives (5, 6); a repeated seed accepted."""
  assert runner.parse_seeds("3") == (0, 1, 2)
  assert runner.parse_seeds("5-7") == (5, 6, 7)
  assert runner.parse_seeds("1,4") == (1, 4)
  for bad in ("x", "2-", "1,1", "0"):
    with pytest.raises(ValueError):
      runner.parse_seeds(bad)


def test_a_block_another_kind_has_begun_is_not_taken(two_kinds):
  """Kind A has recorded one run at H=2 seed 0 and one at H=8 seed 4: from B's folder, every H=2 seed-0 run and
  every H=8 seed-4 run is owned elsewhere (other cells of the block too), H=2 seed 5 is free; from A's own
  folder nothing is, and from a folder outside the registry (the replica) nothing is.

  Breaks checked: the owner keyed on (cell, seed) instead of (horizon, seed) frees the block's other cells;
  the registry check removed refuses the replica's repeats; A's own blocks counted against A."""
  a, b = two_kinds
  cell2 = planned_runs(["E1"], (0,), None, (2,), experiments=round3.EXPERIMENTS)
  names = sorted(cell2)
  _run(a, names[0].rpartition(",seed=")[0], 0)
  _run(a, next(iter(planned_runs(["E1"], (4,), None, (8,), experiments=round3.EXPERIMENTS))).rpartition(",seed=")[0], 4)
  want = names + [n.replace(",seed=0", ",seed=5") for n in names]
  got = kinds.owned_elsewhere(want, b)
  assert set(got) == set(names) and set(got.values()) == {"study3"}
  h8 = sorted(planned_runs(["E1"], (4,), None, (8,), experiments=round3.EXPERIMENTS))
  assert set(kinds.owned_elsewhere(h8, b)) == set(h8)
  assert kinds.owned_elsewhere(want, a) == {}
  assert kinds.owned_elsewhere(want, os.path.join(os.path.dirname(a), "replica")) == {}


def test_the_runner_refuses_another_kinds_block_and_runs_the_free_ones(two_kinds, launched, monkeypatch, capsys):
  """`--records B --seeds 2` with A owning H=2 seed 0: the runner launches E1's 18 H=2 runs of seed 1 only and
  says which block it refused and whose it is.

  Breaks checked: the runner without its owned_elsewhere call launches all 36."""
  a, b = two_kinds
  monkeypatch.setattr(runner.starts, "check", lambda *args, **kw: {})  # the start check has its own tests
  first = sorted(planned_runs(["E1"], (0,), None, (2,), experiments=round3.EXPERIMENTS))[0]
  _run(a, first.rpartition(",seed=")[0], 0)
  root = os.path.join(os.path.dirname(a), "root")
  argv = ["--round", "3", "--root", root, "--records", b, "--only", "E1", "--horizons", "2", "--seeds", "2"]
  assert runner.main(argv) == 0
  want = planned_runs(["E1"], (1,), None, (2,), experiments=round3.EXPERIMENTS)
  assert sorted(launched["run"]) == sorted(want) and len(want) == 18
  assert f"18 runs not launched: their blocks belong to another machine kind: H=2 seed 0 (study3)" in capsys.readouterr().err


def test_load_all_pools_runs_and_refuses_a_block_in_two_folders(two_kinds):
  """Runs of both folders come back with their folder under `_kind`; a block recorded in both is an error.

  Breaks checked: the two-folder check removed lets B's record replace A's silently."""
  a, b = two_kinds
  _run(a, "probe=delayed,horizon=2,arm=ms_grpo", 0)
  _run(b, "probe=delayed,horizon=2,arm=ms_grpo", 5)
  got = kinds.load_all(dirs=[a, b])
  assert {k: r["_kind"] for k, r in got["runs"].items()} == {
      ("probe=delayed,horizon=2,arm=ms_grpo", 0): "study3", ("probe=delayed,horizon=2,arm=ms_grpo", 5): "study3_xeon"}
  _run(b, "probe=delayed,horizon=2,arm=gae_lambda1", 0)
  with pytest.raises(ValueError, match="H=2 seed 0 has runs in study3 and in study3_xeon"):
    kinds.load_all(dirs=[a, b])


def _critic(ratio: float, lo: float, hi: float) -> dict:
  oracle = 0.34
  return {"schema": records.SCHEMA, "kind": "critic", "warm": f"{H2},vpr=0.3", "seed": 0, "readout": {
      "explained_variance": ratio * oracle, "oracle_explained_variance": oracle, "ev_over_oracle_lo": lo,
      "ev_over_oracle_hi": hi, "explained_variance_lo": lo * oracle, "explained_variance_hi": hi * oracle,
      "oracle_explained_variance_lo": oracle, "oracle_explained_variance_hi": oracle, "readout_sessions": 2048}}


def test_a_partial_cell_is_in_band_only_if_every_kinds_critic_is(two_kinds):
  """E4's two partial H=2 cells with seeds 0-1 from kind A (partial critic 0.37) and 5-6 from kind B: with B's
  critic at 0.44 the comparison is tested and its note names both readings; with B's at 0.70 (outside the
  band 0.3-0.6) it is not tested and the reason names B's, although the two critics' mean (0.535) is inside.

  Breaks checked: in_band on the pooled mean ratio calls the 0.70 case tested; cell_stats ignoring
  kind_crit reads A's critic only (the 0.70 case tested)."""
  a, b = two_kinds
  e4 = round3.experiment("E4")
  h2 = [c for c in e4.cells if c.label in ("policy 0.95 critic 1.0 partial h2", "gae_lambda0.95 partial h2")]
  labs = [c.label for c in h2]
  assert len(h2) == 2 and all(round3.critic_state(c) == "partial" for c in h2)
  records.write(a, _critic(0.37, 0.36, 0.38))
  for c in h2:
    for s in (0, 1):
      _run(a, c.name, s)
    for s in (5, 6):
      _run(b, c.name, s)

  def judged(b_ratio):
    records.write(b, _critic(b_ratio, b_ratio - 0.02, b_ratio + 0.02))
    got = kinds.load_all(dirs=[a, b])
    cs = verdicts.cell_stats(e4, got["runs"], got["critics"], got["kinds"])
    return verdicts.untested_because(cs, *labs), verdicts.partial_note(cs, *labs)

  why, note = judged(0.44)
  assert why is None
  assert "0.37 [95% 0.36, 0.38] on the AMD EPYC and 0.44 [95% 0.42, 0.46] on the Intel Xeon" in note
  why, note = judged(0.70)
  assert why is not None and "0.70 [95% 0.68, 0.72] on the Intel Xeon" in why and "outside the registered band" in why
  assert note is None


def test_a_full_critic_is_judged_on_every_kind(two_kinds):
  """E1's `gae_lambda0.95 full h2` against `gae_lambda1 full h2`, seeds 0-1 from kind A (full critic at 0.86) and
  5-6 from B: with B's critic at 0.50 (its interval below the bar 0.8) the comparison is not tested and the
  reason names B's critic; with B's at 0.90 it is tested.

  Breaks checked: the per-kind expansion of full critics removed names no kind (the pooled critic's reason);
  cell_stats ignoring kind_crit reads A's critic only and calls the 0.50 case tested."""
  a, b = two_kinds
  e1 = round3.experiment("E1")
  cells = [c for c in e1.cells if c.label in ("gae_lambda0.95 full h2", "gae_lambda1 full h2")]
  assert len(cells) == 2 and all(round3.critic_state(c) == "full" for c in cells)
  full = lambda r: {**_critic(r, r - 0.02, r + 0.02), "warm": H2}  # noqa: E731
  records.write(a, full(0.86))
  for c in cells:
    for s in (0, 1):
      _run(a, c.name, s)
    for s in (5, 6):
      _run(b, c.name, s)

  def why(b_ratio):
    records.write(b, full(b_ratio))
    got = kinds.load_all(dirs=[a, b])
    return verdicts.untested_because(verdicts.cell_stats(e1, got["runs"], got["critics"], got["kinds"]),
                                     *[c.label for c in cells])

  said = why(0.50)
  assert said is not None and "`gae_lambda0.95 full h2`'s critic on the Intel Xeon EV 0.17" in said
  assert "on the AMD EPYC" not in said
  assert why(0.90) is None


def test_the_per_kind_table_shows_each_kinds_mean_difference(two_kinds):
  """A claim with seeds 0-1 from kind A (d = +0.1, 0.0) and 5-6 from B (d = -0.2, 0.0) gets a final-success row
  of -0.025 over all four seeds, +0.050 on the AMD EPYC and -0.100 on the Intel Xeon; a claim whose seeds are
  all A's gets no row.

  Breaks checked: the skip of one-kind claims removed adds the second claim's rows; the per-kind mean taken
  over every seed prints -0.025 in each kind's column."""
  a, b = two_kinds
  e4 = round3.experiment("E4")
  la, lb, lc = "policy 0.95 critic 1.0 partial h2", "gae_lambda0.95 partial h2", "policy 0.95 critic 1.0 none h2"
  cell = {c.label: c for c in e4.cells}
  for seed, fa, out in ((0, 0.6, a), (1, 0.5, a), (5, 0.3, b), (6, 0.5, b)):
    _run(out, cell[la].name, seed, fa)
    _run(out, cell[lb].name, seed, 0.5)
  for seed in (0, 1):
    _run(a, cell[lc].name, seed, 0.7)
  got = kinds.load_all(dirs=[a, b])
  cs = {"E4": verdicts.cell_stats(e4, got["runs"], got["critics"], got["kinds"])}
  items = [{"kind": "claim", "exp": "E4", "a": la, "b": lb}, {"kind": "claim", "exp": "E4", "a": lc, "b": lb}]
  text = kinds.table([e4], cs, items, "study3")
  rows = [ln for ln in text.splitlines() if ln.startswith("| E4")]
  assert rows[0] == f"| E4: {la} > {lb} | final | -0.025 (n 4) | +0.050 (n 2) | -0.100 (n 2) |"
  assert not any(lc in r for r in rows)
