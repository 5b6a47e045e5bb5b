"""How close an estimator's advantages are to the ground truth A* (numpy).

Items are (session, turn) pairs. Inputs: the estimate `adv_i`, the
Monte-Carlo ground truth `a_star_i` with its standard error `se_i`, the
distance to the final reward `dist_i` (0 = the last turn), and `resample_ri`
(the estimate under R bootstrap resamples of the batch, NaN where item i was
not drawn).

Every agreement fraction comes with its item count and a 95% Wilson score
interval (`wilson_interval`, no continuity correction; scipy's
`binomtest(k, n).proportion_ci(method='wilson')`): the counts are small (a
distance often rests on 1 to 30 items) and the fractions sit near 0 or 1,
where the normal-approximation interval collapses to a point or leaves [0, 1].
"""
from __future__ import annotations

import numpy as np
from scipy import stats


# |A*| below this is zero: where every continuation from a state returns the same
# (an environment whose randomness was drawn at reset and is carried by the clone,
# e.g. bifurcation's payoff), the standard error is 0 and A* = r + V' - V is 0 up to
# float rounding (~1e-16), which must not count as a significant advantage.
MIN_ABS = 1e-6


def significant(a_star_i: np.ndarray, se_i: np.ndarray, z: float = 2.0) -> np.ndarray:
  """Items whose ground truth is distinguishable from 0: |A*| > z standard
  errors and |A*| > MIN_ABS (a deterministic A* of rounding size is 0)."""
  return np.abs(a_star_i) > np.maximum(z * se_i, MIN_ABS)


# The standard normal's 97.5% quantile: a two-sided 95% interval.
Z95 = 1.959963984540054


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float] | None:
  """The Wilson score interval of a binomial proportion k / n (no continuity
  correction), or None for n = 0. Unlike p +- z sqrt(p(1-p)/n) it stays in
  [0, 1] and keeps a width at k = 0 and k = n (0 of 3 is [0, 0.56], not [0, 0])."""
  if n <= 0:
    return None
  if not 0 <= k <= n:
    raise ValueError(f"k={k} successes out of n={n}")
  p, z2 = k / n, z * z
  centre = (p + z2 / (2 * n)) / (1 + z2 / n)
  half = z / (1 + z2 / n) * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
  # At k = 0 (k = n) the lower (upper) end is exactly 0 (1) in closed form; say so, not its rounding.
  lo = 0.0 if k == 0 else max(0.0, float(centre - half))
  hi = 1.0 if k == n else min(1.0, float(centre + half))
  return lo, hi


def sign_agreement(adv_i, a_star_i, se_i, mask_i=None) -> dict:
  """Sign agreement on the significant items (within `mask_i`): `agreement`
  (the fraction where sign(estimate) == sign(A*); an estimate of exactly 0
  disagrees), `items` (how many significant items), `agree` (how many agree)
  and `wilson95` ([lo, hi], module doc); agreement and wilson95 are None
  where there is no item."""
  m = significant(a_star_i, se_i)
  if mask_i is not None:
    m = m & np.asarray(mask_i, bool)
  agree = np.sign(adv_i) == np.sign(a_star_i)
  n, k = int(m.sum()), int(agree[m].sum())
  ci = wilson_interval(k, n)
  return {"agreement": k / n if n else None, "items": n, "agree": k,
          "wilson95": None if ci is None else list(ci)}


def by_distance(adv_i, a_star_i, se_i, dist_i, max_dist: int) -> list[dict]:
  """`sign_agreement` at each distance 0..max_dist."""
  return [sign_agreement(adv_i, a_star_i, se_i, dist_i == d) for d in range(max_dist + 1)]


def agreement_by_distance(adv_i, a_star_i, se_i, dist_i, max_dist: int) -> tuple[list, list]:
  """Per distance 0..max_dist: the fraction of significant items where
  sign(estimate) == sign(A*) (an estimate of exactly 0 disagrees), and how
  many items that is (None where there are none)."""
  per = by_distance(adv_i, a_star_i, se_i, dist_i, max_dist)
  return [r["agreement"] for r in per], [r["items"] for r in per]


def rank_corr(adv_i, a_star_i) -> float:
  """Spearman rank correlation over all items (NaN if either side is constant)."""
  if np.ptp(adv_i) == 0 or np.ptp(a_star_i) == 0:
    return float("nan")
  return float(stats.spearmanr(adv_i, a_star_i).statistic)


def _rms(x) -> float:
  r = float(np.sqrt(np.mean(np.square(x))))
  return r if r > 0 else 1.0


def normalised_bias(adv_i, a_star_i) -> float:
  """mean(estimate / rms(estimate)) - mean(A* / rms(A*)): the offset left when
  both are put on a unit scale (estimators differ in scale by design: group
  normalisation divides by a std)."""
  return float(np.mean(adv_i) / _rms(adv_i) - np.mean(a_star_i) / _rms(a_star_i))


def resample_variance(resample_ri, adv_i) -> float:
  """Mean over items of the variance of the estimate across resamples, in
  units of the estimator's own mean square (0: the estimate of an action
  does not depend on which other sessions were drawn)."""
  ok = np.sum(np.isfinite(resample_ri), axis=0) >= 2
  if not ok.any():
    return float("nan")
  var_i = np.nanvar(resample_ri[:, ok], axis=0)
  return float(np.mean(var_i) / _rms(adv_i) ** 2)
