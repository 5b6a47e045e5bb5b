"""The study's critic bar on the lab's rows: is the critic an estimator reads good enough to test it?

A critic row (lab/variants.py's critic 'mc' or 'coupled') measures the
estimator with that critic. When the critic explains much less of the
returns than the oracle critic does (train/critic_readout.py), a poor sign
agreement is the critic's failure, not the estimator's, so the row is not a
fair test. The bar is train/critic_bar.py's (one rule for every user): the
critic's explained variance >= 0.8 x the oracle's, judged as the study's
report judges it, on the ratio's 95% session-bootstrap interval
(critic_readout.ev_intervals): "yes" when its lower end is >= the bar, "no"
when its upper end is below it, "uncertain" when it straddles it (tested,
and said). Where the interval has no ends (most bootstrap draws with an
oracle EV <= 0) the point ratio decides, yes or no, and `interval` says so.

Pure Python over the `critics` entries of result.json.
"""
from __future__ import annotations

import math

from mtrl_jax.train.critic_bar import CRITIC_BAR, bar_of

BELOW = "critic below the bar: not tested"


def _finite(x) -> bool:
  return x is not None and math.isfinite(x)


def judge(quality: dict) -> dict:
  """The bar for one critic from its readout (`critic_quality`'s keys).

  Returns ratio (EV / oracle EV, or None), ratio_lo / ratio_hi (the interval's
  ends, or None), interval (whether the ends decided), bar ('yes', 'no',
  'uncertain', or None: not judged), tested (False: the row tests nothing, bar 'no' or
  an oracle EV <= 0; None: unknown, no oracle) and verdict (the row's label, or None
  when the row is a fair test).
  """
  ev, oracle = quality.get("explained_variance"), quality.get("oracle_explained_variance")
  lo, hi = quality.get("ev_over_oracle_lo"), quality.get("ev_over_oracle_hi")
  out = {"ratio": None, "ratio_lo": lo if _finite(lo) else None, "ratio_hi": hi if _finite(hi) else None,
         "interval": False, "bar": None, "tested": None, "verdict": None}
  if not _finite(ev) or not _finite(oracle):
    out["verdict"] = "critic bar not judged: no oracle on this env"
    return out
  if oracle <= 1e-9:  # as ev_intervals: a ratio to an oracle that explains nothing means nothing
    # the returns carry no signal that even the oracle explains: no critic row tests anything
    out["verdict"] = f"critic bar not judged (oracle EV {oracle:.2f} <= 0): not tested"
    out["tested"] = False
    return out
  out["ratio"] = ev / oracle
  out["interval"] = out["ratio_lo"] is not None and out["ratio_hi"] is not None
  out["bar"] = bar_of(out["ratio"], out["ratio_lo"], out["ratio_hi"])
  out["tested"] = out["bar"] != "no"
  if out["bar"] == "no":
    out["verdict"] = BELOW
  elif out["bar"] == "uncertain":
    out["verdict"] = f"critic uncertain: EV / oracle [{lo:.2f}, {hi:.2f}] straddles {CRITIC_BAR} (tested)"
  return out


def said(j: dict) -> str:
  """The ratio and its bar as a table cell: '0.79 [0.61, 0.93] uncertain', '0.79 (point) no', '-'."""
  if j["ratio"] is None:
    return "-"
  ends = f" [{j['ratio_lo']:.2f}, {j['ratio_hi']:.2f}]" if j["interval"] else " (point)"
  return f"{j['ratio']:.2f}{ends} {j['bar']}"
