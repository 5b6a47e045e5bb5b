"""train/critic_readout.py's session-bootstrap intervals of the critic's EV, the oracle's and their ratio.

Property tests against a brute-force bootstrap (a loop that concatenates the drawn rows and scores
them with `fit_scores`), and a coverage check by simulation on sessions whose tokens share a
session effect, where the population EVs are known in closed form.
"""
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrl_jax.train import critic_readout as cr


def batch(rng, rows, width, effect=1.0, noise=0.5, skill=0.6):
  """Rows of a packed batch: target = session effect + token noise; the critic sees `skill` x the
  effect, the oracle all of it; ragged masks, and an all-padding row (it is no session)."""
  s = rng.normal(0, effect, (rows, 1))
  t = s + rng.normal(0, noise, (rows, width))
  lengths = rng.integers(1, width + 1, rows)
  m = (np.arange(width)[None, :] < lengths[:, None]).astype(np.float64)
  m[0] = 0.0
  t = np.where(m > 0, t, 123.0)  # padding targets must not leak into any sum
  return t, np.broadcast_to(skill * s, t.shape).copy(), np.broadcast_to(s, t.shape).copy(), m


def brute_force(v, t, m, o, counts):
  """Per draw: the drawn session rows (row b `counts[b]` times) concatenated and scored with fit_scores;
  NaN for a draw with constant targets (fit_scores says 0 there; the bootstrap drops such draws)."""
  real = np.nonzero(m.sum(1) > 0)[0]
  ev, orc = [], []
  for c in counts:
    idx = np.repeat(real, c)
    flat = t[idx][m[idx] > 0]
    if flat.size < 2 or np.var(flat) <= 1e-12:
      ev.append(np.nan), orc.append(np.nan)
      continue
    ev.append(cr.fit_scores(v[idx], t[idx], m[idx])["explained_variance"])
    orc.append(cr.fit_scores(o[idx], t[idx], m[idx])["explained_variance"])
  return np.array(ev), np.array(orc)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 12), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_each_draw_equals_the_rows_concatenated(rows, width, seed):
  """Every draw's EVs from the sufficient statistics equal fit_scores on the drawn rows concatenated.

  Break caught: resampling tokens instead of rows, a padding row counted as a session, padding
  tokens entering the sums (its targets are 123), or the oracle's residual using the critic's values."""
  rng = np.random.default_rng(seed)
  t, v, o, m = batch(rng, rows + 1, width)
  v = v + rng.normal(0, 0.3, v.shape)  # not a function of the session alone: tokens matter too
  stats = cr.session_stats(v, t, m, o)
  assert len(stats) == rows and stats[:, 0].sum() == m.sum()
  counts = cr.resample_counts(rows, 30, seed)
  assert np.all(counts.sum(1) == rows)  # each draw is `rows` sessions
  ev, orc = cr.evs_from_stats(counts @ stats)
  want_ev, want_or = brute_force(v, t, m, o, counts)
  np.testing.assert_array_equal(np.isnan(ev), np.isnan(want_ev))  # the same draws are degenerate
  ok = np.isfinite(ev)
  np.testing.assert_allclose(ev[ok], want_ev[ok], rtol=1e-7, atol=1e-7)
  np.testing.assert_allclose(orc[ok], want_or[ok], rtol=1e-7, atol=1e-7)


@settings(max_examples=15, deadline=None)
@given(st.integers(5, 40), st.integers(0, 2**31 - 1))
def test_intervals_are_the_brute_force_percentiles(rows, seed):
  """ev_intervals' ends are the percentiles of the brute-force draws (the same counts), the ratio's
  taken draw by draw (the same rows for critic and oracle), and readout_sessions counts real rows.

  Break caught: the critic and the oracle resampled with different rows (the ratio's ends move),
  a ratio interval taken as the ratio of the two intervals' ends, or the level's percentiles wrong."""
  rng = np.random.default_rng(seed)
  t, v, o, m = batch(rng, rows + 1, 5)
  v = v + rng.normal(0, 0.3, v.shape)
  got = cr.ev_intervals(v, t, m, o, boot=200, seed=seed)
  ev, orc = brute_force(v, t, m, o, cr.resample_counts(rows, 200, seed))
  keep = np.isfinite(ev)
  ev, orc = ev[keep], orc[keep]
  ratio = np.where(orc > 1e-9, ev / np.where(orc > 1e-9, orc, 1.0), np.nan)
  ratio = ratio[np.isfinite(ratio)]
  assert got["readout_sessions"] == rows
  np.testing.assert_allclose([got["explained_variance_lo"], got["explained_variance_hi"]],
                             np.percentile(ev, [2.5, 97.5]), rtol=1e-7, atol=1e-9)
  np.testing.assert_allclose([got["oracle_explained_variance_lo"], got["oracle_explained_variance_hi"]],
                             np.percentile(orc, [2.5, 97.5]), rtol=1e-7, atol=1e-9)
  if ratio.size >= 100:
    np.testing.assert_allclose([got["ev_over_oracle_lo"], got["ev_over_oracle_hi"]],
                               np.percentile(ratio, [2.5, 97.5]), rtol=1e-7, atol=1e-9)


def test_intervals_cover_the_population_evs():
  """Over 400 simulated readouts of 200 sessions (a session effect s ~ N(0, 1) shared by its tokens,
  token noise sd 0.5; the critic predicts 0.6 s, the oracle s), each 95% interval covers the
  population value in [90%, 98%] (400 trials: sd 1.1 points; the percentile bootstrap of a variance
  ratio runs a little under 95% at 200 sessions: 92.0-94.8% here, 92.3-93.8% at another seed, and
  93-96% at 1,000 sessions, measured 2026-11-28). Population: Var t = 1.25, critic EV = 1 - (0.16 + 0.25) / 1.25 = 0.672,
  oracle EV = 1 - 0.25 / 1.25 = 0.8, ratio 0.84.

  Break caught: resampling tokens instead of sessions (the tokens of a session share s, so token
  intervals are far too narrow: checked, the test fails), or intervals at the wrong level (90%: fails)."""
  truth = {"explained_variance": 1 - 0.41 / 1.25, "oracle_explained_variance": 0.8, "ev_over_oracle": 0.84}
  rng = np.random.default_rng(7)
  hits = {k: 0 for k in truth}
  trials = 400
  for i in range(trials):
    t, v, o, m = batch(rng, 201, 12)
    got = cr.ev_intervals(v, t, m, o, boot=1000, seed=i)
    for k, x in truth.items():
      hits[k] += got[f"{k}_lo"] <= x <= got[f"{k}_hi"]
  cover = {k: h / trials for k, h in hits.items()}
  assert all(0.90 <= c <= 0.98 for c in cover.values()), cover


def test_fast_at_study_size():
  """2,000 draws over 1,000 sessions of 40 tokens take under a second (~0.05 s measured on the shared
  2-core machine under load; a readout must not cost a visible share of value pretraining).

  Break caught: each draw scored by fit_scores on its rows concatenated (~2.2 s here, measured). Not
  caught: constant factors (counts drawn with Generator.multinomial, ~0.2 s, pass)."""
  rng = np.random.default_rng(0)
  t, v, o, m = batch(rng, 1001, 40)
  start = time.perf_counter()
  got = cr.ev_intervals(v, t, m, o, boot=2000)
  assert time.perf_counter() - start < 1.0
  assert got["readout_sessions"] == 1000
  assert got["explained_variance_lo"] < got["explained_variance_hi"]


def test_readout_adds_the_intervals_around_its_points():
  """readout(boot=N) keeps its point values and adds intervals around them on the same oracle values
  (bifurcation-like closed form: the oracle is exact); boot=0 adds nothing.

  Break caught: the intervals computed on an oracle other than the readout's (e.g. zeros: the
  oracle's interval then sits around 0, not around the point oracle EV)."""
  rng = np.random.default_rng(3)
  rows, width = 120, 6
  arm = rng.integers(0, 2, rows)
  pay = np.where(arm == 1, 1.0, 0.0)
  t = pay[:, None] + rng.normal(0, 0.3, (rows, 1)) + np.zeros((rows, width))
  turn = np.zeros((rows, width), np.int64)
  m = np.ones((rows, width))
  v = 0.4 * pay[:, None] + np.zeros((rows, width))
  kw = dict(first_actions_b=["B" if a else "A" for a in arm], group_b=np.arange(rows) // 4,
            decision_fn=lambda a: a, value_fn=lambda k, d: 1.0 if d == "B" else 0.0)
  plain = cr.readout(v, t, m, turn, **kw)
  got = cr.readout(v, t, m, turn, **kw, boot=500)
  assert {k: got[k] for k in plain} == plain and "readout_sessions" not in plain
  assert got["readout_sessions"] == rows
  for k in ("explained_variance", "oracle_explained_variance"):
    assert got[f"{k}_lo"] < got[k] < got[f"{k}_hi"]
  ratio = got["explained_variance"] / got["oracle_explained_variance"]
  assert got["ev_over_oracle_lo"] < ratio < got["ev_over_oracle_hi"]


def test_clusters_resample_whole_groups():
  """With cluster ids, a draw takes whole clusters: rows of one cluster always move together, so two
  copies of each row as one cluster give exactly the intervals of the rows alone with the same draws;
  as separate rows they give narrower ones (twice the sessions, as if independent).

  Break caught: cluster ids ignored (the clustered intervals narrow like the duplicated rows'), or
  readout_sessions counting clusters instead of sessions."""
  rng = np.random.default_rng(5)
  t, v, o, m = batch(rng, 61, 8)
  single = cr.ev_intervals(v, t, m, o, boot=500, seed=1)
  two = lambda x: np.concatenate([x, x])  # noqa: E731
  ids = two(np.arange(61))
  paired = cr.ev_intervals(two(v), two(t), two(m), two(o), boot=500, seed=1, cluster_b=ids)
  loose = cr.ev_intervals(two(v), two(t), two(m), two(o), boot=500, seed=1)
  assert paired["readout_sessions"] == 120 and single["readout_sessions"] == 60
  for k in ("explained_variance", "oracle_explained_variance", "ev_over_oracle"):
    assert paired[f"{k}_lo"] == pytest.approx(single[f"{k}_lo"], abs=1e-12)
    assert paired[f"{k}_hi"] == pytest.approx(single[f"{k}_hi"], abs=1e-12)
  assert loose["explained_variance_hi"] - loose["explained_variance_lo"] < (
      0.85 * (single["explained_variance_hi"] - single["explained_variance_lo"]))


def test_degenerate_inputs():
  """No session, or constant targets: NaN ends and the session count, never a crash; without an
  oracle only the critic's ends.

  Break caught: a division by a zero variance raising, or NaN draws kept in the percentiles."""
  z = np.zeros((3, 4))
  got = cr.ev_intervals(z, z, z, z, boot=50)
  assert got["readout_sessions"] == 0 and np.isnan(got["explained_variance_lo"])
  one = np.ones((3, 4))
  got = cr.ev_intervals(z, one, one, z, boot=50)
  assert got["readout_sessions"] == 3 and np.isnan(got["oracle_explained_variance_hi"])
  assert set(cr.ev_intervals(z, one, one, boot=10)) == {"readout_sessions", "explained_variance_lo",
                                                       "explained_variance_hi"}


if __name__ == "__main__":
  pytest.main([__file__])
