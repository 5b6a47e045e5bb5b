"""benchmarks/async_curves.py: the smoothing, crossing and over-seed arithmetic of benchmarks/async_rl.py.

Pure numbers, no JAX: runs in about a second.
"""
import importlib.util
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("benchmarks_async_curves",
                                               os.path.join(REPO, "benchmarks", "async_curves.py"))
ac = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ac)

curves = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(curves, st.data())
def test_isotonic_fit_is_the_least_squares_monotone_fit(y, data):
  """Non-decreasing, mean-preserving, and no non-decreasing curve fits y better.

  Catches: no pooling (returns y: not monotone), pooling with a plain instead of
  a weighted mean of blocks (mean and optimality break on 3+ merged points).
  """
  fit = ac.isotonic_fit(y)
  assert fit.shape == (len(y),)
  assert np.all(np.diff(fit) >= -1e-12)
  assert math.isclose(fit.sum(), sum(y), abs_tol=1e-9)
  # Any other non-decreasing candidate has a squared error at least as large.
  z = np.sort(data.draw(st.lists(st.floats(0.0, 1.0), min_size=len(y), max_size=len(y))))
  err = lambda c: float(np.sum((np.asarray(y) - c) ** 2))
  assert err(fit) <= err(z) + 1e-9
  assert err(fit) <= err(np.sort(y)) + 1e-9


def test_isotonic_fit_pools_a_spike_with_the_evals_after_it():
  """A spike of 0.85 followed by 0.60, 0.62, 0.65 becomes their mean, 0.68 (worked by hand)."""
  np.testing.assert_allclose(ac.isotonic_fit([0.5, 0.85, 0.6, 0.62, 0.65, 0.7]),
                             [0.5, 0.68, 0.68, 0.68, 0.68, 0.7])
  np.testing.assert_allclose(ac.isotonic_fit([0.1, 0.2, 0.3]), [0.1, 0.2, 0.3])


def test_ema_and_running_mean_by_hand():
  np.testing.assert_allclose(ac.ema([0.0, 1.0, 1.0], 0.5), [0.0, 0.5, 0.75])
  np.testing.assert_allclose(ac.running_mean([0.0, 3.0, 0.0, 3.0], 3), [1.5, 1.0, 2.0, 1.5])
  with pytest.raises(ValueError, match="kind"):
    ac.smooth([0.1], "median")


def test_first_crossing_interpolates_updates_and_seconds():
  """Target 0.6 between evals 0.5 (update 4, 10 s) and 0.9 (update 6, 30 s): a quarter of the way.

  Catches: returning the eval at or after the crossing (update 6, 30 s), or
  the one before it, instead of interpolating.
  """
  c = ac.first_crossing([0, 2, 4, 6], [0.0, 5.0, 10.0, 30.0], [0.1, 0.3, 0.5, 0.9], 0.6)
  assert tuple(c) == pytest.approx((4.5, 15.0))
  assert ac.first_crossing([0, 2], [0.0, 5.0], [0.1, 0.3], 0.6) is None
  assert ac.first_crossing([0, 2], [0.0, 5.0], [0.7, 0.8], 0.6) == ac.Crossing(0.0, 0.0)
  # Exactly at an eval: that eval.
  assert (tuple(ac.first_crossing([0, 2, 4], [0.0, 5.0, 9.0], [0.1, 0.6, 0.9], 0.6)) 
      == pytest.approx((2.0, 5.0)))


def test_a_single_noisy_eval_misleads_the_raw_crossing_but_not_the_smoothed_one():
  """A lucky eval at update 2 makes the raw curve 'cross' 0.8 there; the true rise comes at update 12-14.

  Sync's raw speedup would be taken at its spike (2 updates, 8 s) against an
  async arm without one: 8 / 9 = 0.89x, while the curves say 3.4x. The
  monotone fit puts both crossings in the rise. Catches: crossings read from
  the raw evals (the pre-rewrite benchmark), or a smoother that keeps spikes.
  """
  upd = [0, 2, 4, 6, 8, 10, 12, 14, 16]
  sync_s = [4.0 * u for u in upd]  # 4 s per update
  async_s = [1.0 * u for u in upd]  # 1 s per update, the same learning per update
  sync_y = [0.50, 0.84, 0.60, 0.62, 0.66, 0.70, 0.78, 0.86, 0.90]
  async_y = [0.50, 0.55, 0.60, 0.64, 0.66, 0.72, 0.76, 0.88, 0.89]
  target = 0.8
  raw = ac.first_crossing(upd, sync_s, sync_y, target)
  assert raw.updates == pytest.approx(2 * 0.30 / 0.34)  # the spike: 0.50 -> 0.84 crosses 0.8 at 1.76 updates
  for kind in ("mean_isotonic", "isotonic"):
    sm_sync = ac.first_crossing(upd, sync_s, ac.smooth(sync_y, kind), target)
    sm_async = ac.first_crossing(upd, async_s, ac.smooth(async_y, kind), target)
    assert 12 < sm_sync.updates < 14 and 12 < sm_async.updates < 14, kind
    assert ac.speedup(sm_sync, sm_async) == pytest.approx(4.0 * sm_sync.updates / sm_async.updates)
    assert ac.speedup(sm_sync, sm_async) > 3.0
  assert ac.speedup(raw, ac.first_crossing(upd, async_s, async_y, target)) < 1.0


def test_default_smoothing_reduces_crossing_error_on_binomial_eval_noise():
  """A logistic true curve, evals of 128 Bernoulli episodes every 2 updates: the smoothed crossing is closer.

  Over 300 simulated runs the mean absolute crossing error (in updates) of the
  default smoother is well under that of the raw evals, and its mean error is
  near 0. Catches a smoother that does nothing (equal errors) or a one-sided
  one (an EMA lags ~2 updates).
  """
  rng = np.random.default_rng(0)
  upd = np.arange(0, 25, 2, dtype=float)
  true = lambda u: 0.5 + 0.4 / (1 + np.exp(-(u - 16.0) / 4.0))
  target = 0.5 + 0.8 * (true(24.0) - 0.5)
  u_fine = np.linspace(0, 24, 24001)
  true_cross = u_fine[np.argmax(true(u_fine) >= target)]
  err_raw, err_sm = [], []
  for _ in range(300):
    y = rng.binomial(128, true(upd)) / 128
    for errs, curve in ((err_raw, y), (err_sm, ac.smooth(y, "mean_isotonic"))):
      c = ac.first_crossing(upd, upd, curve, target)
      errs.append((c.updates if c else 24.0) - true_cross)
  mae = lambda e: float(np.mean(np.abs(e)))
  print("crossing MAE smoothed / raw:", mae(err_sm), mae(err_raw))
  assert mae(err_sm) < 0.8 * mae(err_raw), (mae(err_sm), mae(err_raw))
  assert abs(np.mean(err_sm)) < 0.5, np.mean(err_sm)  # and it does not lag


def test_speedup_and_summary_over_seeds():
  """Median and range over seeds; an async seed that never reaches the target counts 0; nan seeds drop out.

  Catches: mean instead of median (would give 2.0 here, not 2.5), a
  never-crossing arm skipped (median 2.75) or given nan.
  """
  s = ac.Crossing
  assert ac.speedup(s(10, 30.0), s(10, 10.0)) == pytest.approx(3.0)
  assert ac.speedup(s(10, 30.0), None) == 0.0
  assert math.isnan(ac.speedup(None, s(10, 10.0)))
  assert math.isnan(ac.speedup(s(0, 0.0), s(0, 0.0)))  # warm start already at the target
  sp = [ac.speedup(s(12, 40.0), s(12, 16.0)), ac.speedup(s(14, 42.0), None), ac.speedup(s(13, 39.0), s(13, 13.0)),
        ac.speedup(s(13, 39.0), s(13, 19.5)), float("nan")]
  assert sp[:4] == pytest.approx([2.5, 0.0, 3.0, 2.0])
  summ = ac.summarise(sp)
  assert tuple(summ) == pytest.approx((2.25, 0.0, 3.0, 4))
  assert ac.summarise([2.5, 3.0, 2.0]).median == pytest.approx(2.5)
  assert ac.summarise([float("nan")]).n == 0
  assert ac.target_success(0.5, 0.9, 0.8) == pytest.approx(0.82)
