"""The lab's binomial intervals (scores.wilson_interval) and the counts they rest on (scores.sign_agreement)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrl_jax.lab import scores

counts = st.integers(1, 400).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n)))


@settings(max_examples=200, deadline=None)
@given(counts)
def test_wilson_matches_scipy(kn):
  """Catches a wrong formula (e.g. the normal-approximation interval p +- z sqrt(p(1-p)/n), a
  continuity correction, z for 90% or 97.5%, n for n^2 in the z^2/4n^2 term): scipy's
  binomtest(k, n).proportion_ci(method='wilson') is the reference (scipy is a dependency of jax)."""
  from scipy.stats import binomtest
  k, n = kn
  ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
  lo, hi = scores.wilson_interval(k, n)
  assert lo == pytest.approx(ref.low, abs=1e-12)
  assert hi == pytest.approx(ref.high, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(counts)
def test_wilson_properties(kn):
  """Catches an interval that leaves [0, 1], misses its own point estimate, is not mirrored under
  k -> n - k (swapped ends), or has zero width at k = 0 or k = n (the normal approximation's failure)."""
  k, n = kn
  lo, hi = scores.wilson_interval(k, n)
  assert 0.0 <= lo <= k / n <= hi <= 1.0
  assert hi - lo > 0.0
  lo2, hi2 = scores.wilson_interval(n - k, n)
  assert lo2 == pytest.approx(1 - hi, abs=1e-12) and hi2 == pytest.approx(1 - lo, abs=1e-12)
  # Four times the items at the same fraction: a narrower interval.
  lo4, hi4 = scores.wilson_interval(4 * k, 4 * n)
  assert hi4 - lo4 < hi - lo


def test_wilson_closed_forms():
  """Hand values: at k = 0 the interval is [0, z^2 / (n + z^2)] (0 of 29: [0, 0.117]); at k = n,
  [n / (n + z^2), 1]; 3 of 10 is [0.108, 0.603]; n = 0 has no interval. Catches the ends at k = 0
  or n left as rounding (1 - 1e-16 printed as 1.00 but compared as < 1) or a wrong z."""
  z2 = scores.Z95 ** 2
  assert scores.wilson_interval(0, 29) == (0.0, pytest.approx(z2 / (29 + z2), abs=1e-12))
  assert scores.wilson_interval(0, 29)[1] == pytest.approx(0.11697, abs=1e-5)
  assert scores.wilson_interval(10, 10) == (pytest.approx(10 / (10 + z2), abs=1e-12), 1.0)
  lo, hi = scores.wilson_interval(3, 10)
  p, n = 0.3, 10
  centre = (p + z2 / (2 * n)) / (1 + z2 / n)
  half = scores.Z95 / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
  assert (lo, hi) == (pytest.approx(centre - half), pytest.approx(centre + half))
  assert (round(lo, 3), round(hi, 3)) == (0.108, 0.603)
  assert scores.wilson_interval(0, 0) is None
  with pytest.raises(ValueError):
    scores.wilson_interval(4, 3)


def test_sign_agreement_counts_and_interval():
  """Items: 5, of which 4 significant (item 2: |A*| < 2 se), 2 of those agree (item 3's estimate is
  0: disagrees). Catches the interval computed on all items (k/n = 2/5) instead of the significant
  ones (2/4), a mask ignored, and by_distance's entries out of line with agreement_by_distance."""
  a_star = np.array([1.0, -1.0, 0.1, 1.0, -2.0])
  se = np.full(5, 0.1)
  est = np.array([0.5, 0.3, -9.0, 0.0, -1.0])
  got = scores.sign_agreement(est, a_star, se)
  assert (got["items"], got["agree"], got["agreement"]) == (4, 2, 0.5)
  assert got["wilson95"] == list(scores.wilson_interval(2, 4))
  masked = scores.sign_agreement(est, a_star, se, np.array([True, True, True, False, False]))
  assert (masked["items"], masked["agree"]) == (2, 1)
  none = scores.sign_agreement(est, a_star, se, np.zeros(5, bool))
  assert none == {"agreement": None, "items": 0, "agree": 0, "wilson95": None}
  dist = np.array([0, 0, 0, 1, 2])
  per = scores.by_distance(est, a_star, se, dist, 3)
  assert [r["items"] for r in per] == [2, 1, 1, 0]
  assert [r["wilson95"] for r in per][:3] == [list(scores.wilson_interval(1, 2)), [0.0, scores.wilson_interval(0, 1)[1]],
                                              [scores.wilson_interval(1, 1)[0], 1.0]]
  assert scores.agreement_by_distance(est, a_star, se, dist, 3) == ([r["agreement"] for r in per],
                                                                    [r["items"] for r in per])
