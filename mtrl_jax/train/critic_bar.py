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


CRITIC_ESTIMATORS = ("gae", "turn_gae", "bilevel_gae")  # the estimators that bootstrap from a critic


def ratio_of(readout: dict) -> tuple[Optional[float], Optional[float], Optional[float]]:
  """(EV / oracle EV, its interval's ends) of a critic readout (train/critic_readout.py's keys);
  None where the oracle explains nothing (EV <= 0) or an end is missing."""
  ev, oracle = readout.get("explained_variance"), readout.get("oracle_explained_variance")
  if not (_finite(ev) and _finite(oracle)) or oracle <= 1e-9:
    return None, None, None
  lo, hi = readout.get("ev_over_oracle_lo"), readout.get("ev_over_oracle_hi")
  return ev / oracle, (lo if _finite(lo) else None), (hi if _finite(hi) else None)


def verdict(readout: dict) -> str:
  """One line on the critic handed to RL: 'critic at the bar', 'critic below the bar' or 'critic
  uncertain at the bar' with the ratio and its interval, or why it was not judged."""
  ratio, lo, hi = ratio_of(readout)
  bar = bar_of(ratio, lo, hi)
  if bar is None:
    oracle = readout.get("oracle_explained_variance")
    why = "no oracle" if not _finite(oracle) else f"the oracle's EV is {oracle:.3f} <= 0"
    return f"critic bar not judged: {why}"
  ends = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else " (point: no interval)"
  said = {"yes": "at the bar", "no": "below the bar", "uncertain": "uncertain at the bar"}[bar]
  return (f"critic {said}: explained variance {readout['explained_variance']:.3f} is {ratio:.2f}{ends} of the "
          f"oracle critic's {readout['oracle_explained_variance']:.3f} (bar {CRITIC_BAR} x)")


def rl_warning(estimator: str, readout: Optional[dict], pretrained: bool) -> Optional[str]:
  """The warning an RL stage with a critic-based estimator logs when its critic is not known to be at
  the bar (None: nothing to say). `readout`: value pretraining's final readout of this critic, if any;
  `pretrained`: whether the critic went through value pretraining at all."""
  if estimator not in CRITIC_ESTIMATORS:
    return None
  fix = ("raise config.value_pretrain.steps (the cap in critic steps) or value_pretrain.max_seconds, "
         "check value_pretrain.lr, or use a critic-free estimator (ms_grpo, grpo)")
  if not pretrained:
    return (f"rl.estimator={estimator!r} bootstraps from a critic that was not pretrained "
            f"(value_pretrain off): its advantages start as noise. Enable value_pretrain, or use a "
            f"critic-free estimator (ms_grpo, grpo)")
  if readout is None:
    return (f"rl.estimator={estimator!r}: the pretrained critic has no readout to judge it by "
            f"(a warm start from an older run?); its bar is unknown")
  line = verdict(readout)
  if line.startswith("critic at the bar"):
    return None
  if line.startswith("critic uncertain"):
    return f"rl.estimator={estimator!r}: {line}; raise value_pretrain.readout_tasks to judge it, or {fix}"
  if line.startswith("critic bar not judged"):
    return f"rl.estimator={estimator!r}: {line}"
  return f"rl.estimator={estimator!r} with a {line}: its advantages are mostly the critic's error; {fix}"
