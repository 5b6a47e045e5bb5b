"""The study's statistics, pure numpy: bootstrap intervals over seeds, token-weighted AUC, comparisons.

Every function is deterministic (a fixed RNG seed), so a report regenerated
from the same runs prints the same intervals.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

BOOT = 2000  # bootstrap resamples
LEVEL = 0.95
SEED = 0
MIN_N = 2  # compare() calls no winner on fewer seeds a side: one seed's "interval" is a point


class Estimate(NamedTuple):
  n: int
  mean: float
  lo: float
  hi: float


def bootstrap_ci(values: Sequence[float], boot: int = BOOT, level: float = LEVEL,
                 seed: int = SEED) -> Estimate | None:
  """Mean over seeds and its percentile-bootstrap interval; n=1 -> the value itself; n=0 -> None.

  The RNG is re-seeded on every call, so an interval depends only on the values.
  """
  x_n = np.asarray(values, dtype=np.float64).reshape(-1)
  n = x_n.size
  if n == 0:
    return None
  mean = float(x_n.mean())
  if n == 1:
    return Estimate(1, mean, mean, mean)
  idx_bn = np.random.default_rng(seed).integers(0, n, size=(boot, n))
  means_b = x_n[idx_bn].mean(axis=1)
  lo, hi = np.percentile(means_b, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
  return Estimate(n, mean, float(lo), float(hi))


def auc(tokens: Sequence[float], success: Sequence[float]) -> float | None:
  """Area under success vs tokens (trapezoid) divided by the token span: a token-weighted mean success.

  A constant curve gives that constant whatever the token steps are; a single
  point (or a zero span) gives the plain mean; no points give None.
  """
  t_p = np.asarray(tokens, dtype=np.float64)
  y_p = np.asarray(success, dtype=np.float64)
  if t_p.shape != y_p.shape:
    raise ValueError(f"tokens {t_p.shape} and success {y_p.shape} differ in shape")
  if t_p.size == 0:
    return None
  if np.any(np.diff(t_p) < 0):
    raise ValueError("tokens must not decrease (tokens_seen is cumulative)")
  span = t_p[-1] - t_p[0]
  if span <= 0:
    return float(y_p.mean())
  area = float(np.sum(np.diff(t_p) * (y_p[1:] + y_p[:-1]) / 2))
  return area / float(span)


def compare(a_values: Sequence[float], b_values: Sequence[float], boot: int = BOOT,
            min_n: int = MIN_N) -> str:
  """"A>B" / "B>A" when the two 95% bootstrap intervals are disjoint, else "overlap".

  "n/a" when either side has fewer than `min_n` values (no interval worth the name).
  """
  a, b = bootstrap_ci(a_values, boot), bootstrap_ci(b_values, boot)
  if a is None or b is None or a.n < min_n or b.n < min_n:
    return "n/a"
  if a.lo > b.hi:
    return "A>B"
  if b.lo > a.hi:
    return "B>A"
  return "overlap"


def verdict(judgements: Sequence[tuple[str, str]]) -> str:
  """Over the claimed comparisons (A beats B), each judged as (on final success, on AUC).

  not reproduced: some comparison is B>A on either metric (the reverse, significantly);
  reproduced: every comparison is A>B on at least one metric (and none reversed);
  inconclusive otherwise (also when there is no comparison).
  """
  if any("B>A" in pair for pair in judgements):
    return "not reproduced"
  if judgements and all("A>B" in pair for pair in judgements):
    return "reproduced"
  return "inconclusive"
