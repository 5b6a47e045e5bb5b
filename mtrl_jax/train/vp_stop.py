"""When value pretraining stops: a pure rule over the sequence of its held-out readouts.

A fixed budget stopped right before the critic learnt (issue 43: on a probe
whose value depends on what was seen and what was done, the held-out EV sat
near 0 for ~17 rounds, then rose to 0.5-0.8 within a few). So the stage keeps
fitting while its held-out readout still improves, and stops at the first of:

* `bar`: the critic is at the bar (train/critic_bar.py's rule, on the ratio of
  its EV to the oracle critic's, pooled over the last `window` rounds with a
  session-bootstrap interval: its lower end >= 0.8);
* `ratio`: `stop_at_ratio` > 0 and the latest round's own ratio has reached it
  (a deliberately partial critic, e.g. 0.3-0.6 for the study's third round).
  Not the pooled one: while the critic learns, the window lags it by a round
  or two, and a partial critic's target would be overshot. The stage checks it
  before fitting the round too, so the critic handed to RL is the one that
  readout scored (one more fit can add 0.1-0.2 to the ratio at the rise);
* `plateau`: the smoothed score (the mean held-out R^2 of the last `window`
  rounds) has not beaten its best by more than `min_delta` for `patience`
  rounds (0: never); the window averages out one batch's luck (the oracle's
  own EV swings 0.1-0.4 between 128-session rounds), the patience waits out a
  flat stretch before the critic finds the decision;
* `steps` / `seconds`: the cap in critic optimiser steps, or in wall seconds
  of the stage (0: no wall cap).

R^2 (skill over the best constant), not EV, is the score: a zero-initialised
head's first progress is the mean return, which EV cannot see (any constant
scores EV 0). Once the mean is fitted the two agree.

Each round's record is what the stage measured after scoring that round's
fresh batch (before fitting it): its R^2, the pooled ratio with its ends and
the round's own ratio.
The rule reads only the records, the steps and the seconds, so a resumed stage
(records kept in the checkpoint's meta) decides exactly as an unbroken one.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence

import numpy as np

from mtrl_jax.train import critic_readout
from mtrl_jax.train.critic_bar import bar_of

REASONS = ("bar", "ratio", "steps", "seconds", "plateau")


class Rule(NamedTuple):
  cap_steps: int
  cap_seconds: float = 0.0  # 0: no wall-time cap
  window: int = 1
  patience: int = 0         # 0: never stop on a plateau
  min_delta: float = 0.0
  stop_at_bar: bool = True
  stop_at_ratio: float = 0.0  # 0: off


class RoundRecord(NamedTuple):
  """One round's held-out readout: its R^2, the ratio pooled over the window ending here (with its
  interval's ends), and this round's own ratio."""
  r2: float
  ratio: Optional[float] = None
  ratio_lo: Optional[float] = None
  ratio_hi: Optional[float] = None
  own_ratio: Optional[float] = None


class Decision(NamedTuple):
  stop: bool
  reason: Optional[str]  # one of REASONS, or None
  smoothed: float        # the smoothed score at the last round
  best: float            # its best so far
  since: int             # rounds since the best improved by more than min_delta


def rule_of(v) -> Rule:
  """The rule of `config.value_pretrain`."""
  return Rule(cap_steps=int(v.steps), cap_seconds=float(v.max_seconds), window=int(v.window),
              patience=int(v.patience), min_delta=float(v.min_delta), stop_at_bar=bool(v.stop_at_bar),
              stop_at_ratio=float(v.stop_at_ratio))


def smoothed(scores: Sequence[float], window: int) -> list[float]:
  """Trailing means of `scores` over up to `window` rounds (fewer at the start)."""
  w = max(int(window), 1)
  return [float(np.mean(scores[max(0, i + 1 - w):i + 1])) for i in range(len(scores))]


def plateau(scores: Sequence[float], window: int, min_delta: float) -> tuple[float, float, int]:
  """(smoothed score now, its best, rounds since the best last rose by more than min_delta)."""
  best, since = -math.inf, 0
  s = smoothed(scores, window)
  for x in s:
    if x > best + min_delta:
      best, since = x, 0
    else:
      since += 1
  return (s[-1] if s else -math.inf), best, since


def _finite(x) -> bool:
  return x is not None and math.isfinite(x)


def decide(records: Sequence[RoundRecord], steps: int, seconds: float, rule: Rule) -> Decision:
  """Whether to stop after the last of `records` (module doc); `steps`, `seconds` spent so far."""
  now, best, since = plateau([r.r2 for r in records], rule.window, rule.min_delta)
  last = records[-1] if records else RoundRecord(float("nan"))

  def out(reason):
    return Decision(reason is not None, reason, now, best, since)

  if rule.stop_at_bar and bar_of(last.ratio, last.ratio_lo, last.ratio_hi) == "yes":
    return out("bar")
  if rule.stop_at_ratio > 0 and _finite(last.own_ratio) and last.own_ratio >= rule.stop_at_ratio:
    return out("ratio")
  if steps >= rule.cap_steps:
    return out("steps")
  if rule.cap_seconds > 0 and seconds >= rule.cap_seconds:
    return out("seconds")
  if rule.patience > 0 and since >= rule.patience:
    return out("plateau")
  return out(None)


def pooled_ratio(stats: Sequence[np.ndarray], *, boot: int, seed: int) -> tuple[Optional[float], ...]:
  """(ratio, lo, hi): the critic's EV over the oracle's on the sessions of several rounds read as one
  set (each round's per-session statistics from critic_readout.session_stats, held out), with the
  95% session-bootstrap interval. None where the oracle explains nothing (EV <= 0)."""
  rows = np.concatenate([np.asarray(s, np.float64).reshape(-1, 7) for s in stats]) if stats else np.zeros((0, 7))
  if len(rows) < 2:
    return None, None, None
  ev, oracle = critic_readout.evs_from_stats(rows.sum(0))
  if not (np.isfinite(ev) and np.isfinite(oracle)) or oracle <= 1e-9:
    return None, None, None
  sums = critic_readout.resample_counts(len(rows), boot, seed).astype(np.float64) @ rows
  ev_b, or_b = critic_readout.evs_from_stats(sums)
  with np.errstate(divide="ignore", invalid="ignore"):
    ratio_b = np.where(or_b > 1e-9, ev_b / or_b, np.nan)
  ratio_b = ratio_b[np.isfinite(ratio_b)]
  if ratio_b.size < boot / 2:
    return float(ev / oracle), None, None
  lo, hi = np.percentile(ratio_b, [2.5, 97.5])
  return float(ev / oracle), float(lo), float(hi)
