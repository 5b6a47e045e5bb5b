"""The critic bar: is a critic good enough for an estimator that reads it to be tested?

One rule, used by value pretraining (its stopping rule and the run's summary),
the credit-accuracy lab's critic rows and the study's report: a critic passes
when its explained variance of Monte-Carlo returns is at least `CRITIC_BAR`
times the oracle critic's (train/critic_readout.py), judged on the ratio's 95%
session-bootstrap interval:

* "yes": the interval's lower end is >= the bar;
* "no": its upper end is below the bar (what rests on the critic is not tested);
* "uncertain": it straddles the bar (tested, and said).

Where the interval has no ends (most bootstrap draws had an oracle EV <= 0),
the point ratio decides, yes or no. No ratio at all: not judged (None).
"""
from __future__ import annotations

import math
from typing import Optional

CRITIC_BAR = 0.8


def _finite(x) -> bool:
  return x is not None and math.isfinite(x)


def bar_of(ratio: Optional[float], lo: Optional[float] = None, hi: Optional[float] = None) -> Optional[str]:
  """'yes' / 'no' / 'uncertain' on the interval [lo, hi] when both ends are finite, else on `ratio`
  ('yes' / 'no'); None when there is neither."""
  if _finite(lo) and _finite(hi):
    return "yes" if lo >= CRITIC_BAR else "no" if hi < CRITIC_BAR else "uncertain"
  if not _finite(ratio):
    return None
  return "yes" if ratio >= CRITIC_BAR else "no"
