"""How close an estimator's advantages are to the ground truth A* (numpy).

Items are (session, turn) pairs. Inputs: the estimate `adv_i`, the
Monte-Carlo ground truth `a_star_i` with its standard error `se_i`, the
distance to the final reward `dist_i` (0 = the last turn), and `resample_ri`
(the estimate under R bootstrap resamples of the batch, NaN where item i was
not drawn).
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


def agreement_by_distance(adv_i, a_star_i, se_i, dist_i, max_dist: int) -> tuple[list, list]:
  """Per distance 0..max_dist: the fraction of significant items where
  sign(estimate) == sign(A*) (an estimate of exactly 0 disagrees), and how
  many items that is (None where there are none)."""
  sig = significant(a_star_i, se_i)
  agree = np.sign(adv_i) == np.sign(a_star_i)
  frac, count = [], []
  for d in range(max_dist + 1):
    m = sig & (dist_i == d)
    count.append(int(m.sum()))
    frac.append(float(agree[m].mean()) if m.any() else None)
  return frac, count


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
