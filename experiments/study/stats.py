"""The study's statistics: paired per-seed differences, their t interval, Holm, effect sizes, power.

The design is paired: at one seed every arm starts from the same warm start
and plays the same training tasks and the same eval tasks with the same eval
keys (configs/study.py), so an arm is compared with another through the
per-seed differences d_s = a_s - b_s. `paired_test` gives their mean, a
Student t interval on it (exact under normal differences; its coverage at
n = 8 is checked by simulation in `coverage`, where the percentile bootstrap
of the same mean covers about 88%), a two-sided p-value, the effect size
dz = mean(d) / sd(d), and the minimum detectable effect of the design
(`mde`: the true mean difference a paired t test at this n and this sd of
differences detects with power 0.8). `holm` adjusts the p-values of a family
of comparisons; `judge` and `verdict` turn adjusted tests into the study's
words. The per-arm percentile bootstrap (`bootstrap_ci`) stays for the
tables' per-cell intervals, which are descriptive only.

Every function is deterministic (fixed RNG seeds), so a report regenerated
from the same records prints the same numbers.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
from scipy import optimize
from scipy import stats as sps

BOOT = 2000  # bootstrap resamples
LEVEL = 0.95
SEED = 0
MIN_N = 2  # compare() calls no winner on fewer seeds a side: one seed's "interval" is a point
ALPHA = 0.05  # family-wise error rate of the study's comparisons (Holm)
POWER = 0.8  # the power the minimum detectable effect is stated at


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


# ------------------------------------------------------------------ paired design


class PairedTest(NamedTuple):
  """A paired comparison of A and B over the seeds both have: d_s = a_s - b_s."""
  n: int          # seeds with both sides
  mean: float     # mean of d
  sd: float       # sample sd of d (ddof 1); 0 when n < 2
  lo: float       # t interval on the mean difference (LEVEL); = mean when sd == 0
  hi: float
  p: float        # two-sided p of the paired t test (1.0 when d is all 0; 0.0 when sd == 0 != mean)
  dz: float       # effect size mean / sd (inf-signed when sd == 0 != mean; 0 when all 0)
  mde: float      # minimum detectable |mean difference| at this n and sd (ALPHA two-sided, POWER)


def paired(a_by_seed: dict, b_by_seed: dict) -> tuple[list, np.ndarray]:
  """(seeds both sides have, sorted; the differences a - b at those seeds). None values are missing."""
  seeds = sorted(s for s in a_by_seed if s in b_by_seed and a_by_seed[s] is not None
                 and b_by_seed[s] is not None)
  return seeds, np.array([a_by_seed[s] - b_by_seed[s] for s in seeds], dtype=np.float64)


def t_interval(d: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
  """Student t interval on the mean of d: mean +- t_{n-1, (1+level)/2} sd / sqrt(n). n >= 2."""
  d = np.asarray(d, dtype=np.float64).reshape(-1)
  n = d.size
  if n < 2:
    raise ValueError(f"a t interval needs >= 2 differences, got {n}")
  m, se = float(d.mean()), float(d.std(ddof=1)) / np.sqrt(n)
  half = float(sps.t.ppf((1 + level) / 2, n - 1)) * se
  return float(m - half), float(m + half)


def mde(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
  """The smallest true mean difference a two-sided paired t test (level alpha) at n pairs with this sd of
  differences detects with probability `power`: solved on the noncentral t (exact, not the z shortcut).
  inf for n < 2; 0 for sd == 0."""
  if n < 2:
    return float("inf")
  if sd == 0:
    return 0.0
  df, crit = n - 1, float(sps.t.ppf(1 - alpha / 2, n - 1))

  def shortfall(nc: float) -> float:  # power at noncentrality nc = dz sqrt(n), minus the target
    pw = float(sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc))
    return (1.0 if np.isnan(pw) else pw) - power  # scipy's nct gives NaN far in the tail, where power is 1

  hi = 4.0
  while shortfall(hi) < 0:
    hi *= 2
  dz = optimize.brentq(shortfall, 0.0, hi, xtol=1e-10) / np.sqrt(n)
  return float(dz * sd)


def paired_test(d: Sequence[float], level: float = LEVEL, alpha: float = ALPHA,
                power: float = POWER) -> PairedTest | None:
  """The paired t test on differences d (one per seed); None on fewer than 2."""
  d = np.asarray(d, dtype=np.float64).reshape(-1)
  n = d.size
  if n < 2:
    return None
  m, sd = float(d.mean()), float(d.std(ddof=1))
  if sd <= 1e-12 * max(1.0, abs(m)):  # every seed moved by the same amount (up to float rounding of the mean)
    p = 1.0 if m == 0 else 0.0
    dz = 0.0 if m == 0 else float(np.sign(m)) * float("inf")
    return PairedTest(n, m, 0.0, m, m, p, dz, 0.0)
  lo, hi = t_interval(d, level)
  t = m / (sd / np.sqrt(n))
  p = float(2 * sps.t.sf(abs(t), n - 1))
  return PairedTest(n, m, sd, lo, hi, p, m / sd, mde(sd, n, alpha, power))


def holm(pvalues: Sequence[float]) -> list[float]:
  """Holm-Bonferroni adjusted p-values (same order as given): p_(i) x (m - i + 1), running max, cap 1.
  Rejecting where adjusted p < alpha controls the family-wise error at alpha."""
  p = np.asarray(pvalues, dtype=np.float64).reshape(-1)
  m = p.size
  if m == 0:
    return []
  order = np.argsort(p, kind="stable")
  adj = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
  out = np.empty(m)
  out[order] = adj
  return [float(x) for x in out]


def coverage(interval, n: int = 8, reps: int = 2000, seed: int = SEED, draw=None, truth: float = 0.0) -> float:
  """Share of `reps` simulated samples of n differences whose interval(d) -> (lo, hi) holds the true mean.

  `draw(rng, reps, n)` gives the samples (default: standard normal, a null of mean `truth` = 0)."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((reps, n)) if draw is None else np.asarray(draw(rng, reps, n), dtype=np.float64)
  hits = 0
  for row in x:
    lo, hi = interval(row)
    hits += lo <= truth <= hi
  return hits / reps


def percentile_interval(d: Sequence[float], boot: int = BOOT, level: float = LEVEL, seed: int = SEED):
  """The per-arm interval the study used before: percentile bootstrap of the mean (for `coverage`)."""
  e = bootstrap_ci(d, boot, level, seed)
  return e.lo, e.hi


def judge(test: PairedTest | None, p_adj: float | None, alpha: float = ALPHA) -> str:
  """One metric of one claim "A beats B": "A>B" / "B>A" where the Holm-adjusted p < alpha (sign of the
  mean difference), "n.s." otherwise, "n/a" without a test."""
  if test is None or p_adj is None:
    return "n/a"
  if p_adj < alpha and test.mean != 0:
    return "A>B" if test.mean > 0 else "B>A"
  return "n.s."


def separates(test: PairedTest | None, alpha: float = ALPHA) -> bool:
  """A positive control separates when its paired test finds A > B at level alpha (unadjusted: the
  control is a check of the design, not one of the study's claims)."""
  return test is not None and test.mean > 0 and test.p < alpha


def paired_verdict(judgements: Sequence[Sequence[str]], mdes: Sequence, control,
                   untested: Sequence[str] = ()) -> str:
  """The words for a set of claims, each judged on its metrics ("A>B" / "B>A" / "n.s." / "n/a").

  `mdes[i]` is claim i's minimum detectable effect: a number, or its metrics' MDEs (a sequence; the
  largest finite one is the claim's), None where it has none. `control` is the positive control that
  powers the claims: one bool (or None: no control ran) for all of them, or one per claim.

  not reproduced: some claim is B>A on some metric; reproduced: every claim is A>B on at least one metric.
  Otherwise the claims not A>B on any metric are unresolved, and the words are theirs: underpowered
  (control did not separate) when the control of some unresolved claim ran and did not separate (one
  control that did not separate outweighs any that did), else inconclusive (MDE x: the largest MDE over
  the unresolved claims; a claim already reproduced says nothing of what the design can see);
  not tested (reasons) when no claim could be tested.
  """
  if not judgements:
    return "not tested (" + "; ".join(untested) + ")" if untested else "not tested (no comparison)"
  if len(mdes) != len(judgements):
    raise ValueError(f"{len(mdes)} MDE entries for {len(judgements)} claims: give one per claim")
  controls = list(control) if isinstance(control, (list, tuple)) else [control] * len(judgements)
  if len(controls) != len(judgements):
    raise ValueError(f"{len(controls)} controls for {len(judgements)} claims: give one, or one per claim")
  if any("B>A" in j for j in judgements):
    return "not reproduced"
  if all("A>B" in j for j in judgements):
    return "reproduced"
  open_ = [i for i, j in enumerate(judgements) if "A>B" not in j]
  if any(controls[i] is False for i in open_):
    return "underpowered (control did not separate)"
  per_claim = [m if isinstance(m, (list, tuple)) else [m] for m in (mdes[i] for i in open_)]
  finite = [x for m in per_claim for x in m if x is not None and np.isfinite(x)]
  if not finite:
    return "inconclusive (MDE unknown)"
  top = max(finite)  # two arms that nearly coincide can have an MDE far below 0.001: say it, not "0.000"
  return f"inconclusive (MDE {top:.3f})" if top >= 5e-4 else f"inconclusive (MDE {top:.1e})"


# ------------------------------------------------------------------ critic readout


def explained_variance(y, v) -> float:
  """1 - Var(y - v) / Var(y) (population variances); nan when y is constant."""
  y, v = np.asarray(y, dtype=np.float64), np.asarray(v, dtype=np.float64)
  var = y.var()
  return float(1.0 - (y - v).var() / var) if var > 0 else float("nan")


def ev_intervals(y, critic, oracle, boot: int = BOOT, level: float = LEVEL, seed: int = SEED) -> dict:
  """Percentile-bootstrap intervals over held-out sessions (hundreds: the percentile bootstrap is fine
  there, unlike over 8 seeds) of the critic's EV, the oracle's and their ratio, resampled together
  (the same sessions in each draw), so the 0.8 bar can be judged on the ratio's interval.
  Returns {"ev": (point, lo, hi), "oracle": (...), "ratio": (...)}."""
  y, c, o = (np.asarray(a, dtype=np.float64).reshape(-1) for a in (y, critic, oracle))
  if not y.size == c.size == o.size:
    raise ValueError(f"returns {y.size}, critic {c.size} and oracle {o.size} values differ in count")
  idx = np.random.default_rng(seed).integers(0, y.size, size=(boot, y.size))
  yb, cb, ob = y[idx], c[idx], o[idx]
  var = yb.var(axis=1)
  ok = var > 0
  ev_b = 1.0 - (yb - cb).var(axis=1)[ok] / var[ok]
  or_b = 1.0 - (yb - ob).var(axis=1)[ok] / var[ok]
  ratio_b = ev_b / np.where(or_b != 0, or_b, np.nan)
  q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
  ev, orc = explained_variance(y, c), explained_variance(y, o)
  out = {"ev": (ev, *np.nanpercentile(ev_b, q)), "oracle": (orc, *np.nanpercentile(or_b, q)),
         "ratio": (ev / orc if orc else float("nan"), *np.nanpercentile(ratio_b, q))}
  return {k: tuple(float(x) for x in v) for k, v in out.items()}
