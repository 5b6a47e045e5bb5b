"""train/vp_stop.py: when value pretraining stops, on synthetic readout sequences.

Each test feeds the rule a sequence shaped like one issue 43 measured (a held-out score
flat for ~17 rounds, then rising) or one that reaches the bar, a target ratio or a cap,
and checks the round it stops at and why. Pure functions: milliseconds.
"""
import numpy as np
import pytest

from mtrl_jax.train import critic_readout as cr
from mtrl_jax.train import vp_stop
from mtrl_jax.train.vp_stop import RoundRecord, Rule

# The defaults' rule (config.value_pretrain): 4-round window, patience 24, min_delta 0.01.
DEFAULT = Rule(cap_steps=800, cap_seconds=3600.0, window=4, patience=24, min_delta=0.01)
STEPS_A_ROUND = 8


def run(r2s, rule=DEFAULT, ratios=None, seconds_a_round=1.0):
  """(round it stopped after (1-based), reason) feeding the rule one round at a time, as the stage does."""
  recs = []
  for i, r2 in enumerate(r2s):
    ratio = (None, None, None, None) if ratios is None else tuple(ratios[i]) + (None,) * (4 - len(ratios[i]))
    recs.append(RoundRecord(r2, *ratio))
    d = vp_stop.decide(recs, (i + 1) * STEPS_A_ROUND, (i + 1) * seconds_a_round, rule)
    if d.stop:
      return i + 1, d.reason
  return len(r2s), None


def plateau_then_rise(rng, flat=17, noise=0.02):
  """Issue 43's shape: R^2 climbs from -1 to ~0 in 3 rounds (the mean), stays ~0 (+-noise) for
  `flat` rounds, then rises to 0.5, 0.74, 0.83 and stays there."""
  head = [-1.0, -0.3, -0.05]
  flat_part = list(rng.normal(0.0, noise, flat))
  rise = [0.2, 0.5, 0.74, 0.83] + list(0.83 + rng.normal(0, noise, 60))
  return head + flat_part + rise


def test_waits_out_a_17_round_plateau_then_stops_on_the_next_one():
  """The default rule keeps fitting through 17 flat rounds (the critic learns after them), and stops
  `patience` rounds after the rise ends, not at the cap.

  Break checked: a short patience (3, the old default's scale) stops inside the flat stretch
  (asserted here: round 7, before the critic learns)."""
  rng = np.random.default_rng(0)
  seq = plateau_then_rise(rng)
  stopped, why = run(seq)
  rise_done = 3 + 17 + 4
  assert why == "plateau"
  assert rise_done + DEFAULT.patience - 2 <= stopped <= rise_done + DEFAULT.patience + DEFAULT.window + 2, stopped
  early, why_early = run(seq, DEFAULT._replace(patience=3))
  assert why_early == "plateau" and early < 3 + 17, early


def test_a_longer_plateau_than_the_patience_stops_the_stage():
  """A critic that never learns (R^2 ~0 after the mean): the stage stops some `patience` rounds after
  the mean was fitted (a lucky window may reset the count once or twice), long before the cap
  (800 steps = 100 rounds).

  Break checked: the smoothed score compared with the previous round's instead of its best so
  far (noise keeps resetting the count: it runs past round 45)."""
  rng = np.random.default_rng(1)
  seq = [-1.0, -0.3, -0.05] + list(rng.normal(0, 0.02, 200))
  stopped, why = run(seq)
  assert why == "plateau" and 24 + 3 <= stopped <= 45, stopped


def test_stops_at_the_step_cap_with_no_patience():
  """patience 0: never on a plateau; the cap in critic steps ends it at round cap / steps a round.

  Break checked: `steps > rule.cap_steps` (one round late: round 11)."""
  stopped, why = run([0.0] * 50, DEFAULT._replace(patience=0, cap_steps=80))
  assert (stopped, why) == (10, "steps")


def test_stops_at_the_wall_time_cap():
  """max_seconds 25 at 2 s a round: after round 13 (26 s), reason 'seconds'; 0 means no wall cap."""
  rule = DEFAULT._replace(patience=0, cap_seconds=25.0)
  assert run([0.0] * 50, rule, seconds_a_round=2.0) == (13, "seconds")
  assert run([0.0] * 50, rule._replace(cap_seconds=0.0), seconds_a_round=2.0) == (50, None)


def test_stops_at_the_bar_on_the_pooled_ratio_interval():
  """The critic bar's rule (critic_bar.bar_of): stop when the window's ratio interval's lower end
  reaches 0.8; a straddling interval ('uncertain') or a high point ratio with a low lower end goes on.

  Break checked: the bar judged on the point ratio alone (`last.ratio >= CRITIC_BAR`): round 3
  (point 0.85, interval [0.6, 1.1]) would stop it."""
  ratios = [(0.2, 0.0, 0.4), (0.6, 0.3, 0.9), (0.85, 0.6, 1.1), (0.95, 0.81, 1.1), (1.0, 0.9, 1.1)]
  assert run([0.1, 0.2, 0.3, 0.4, 0.5], ratios=ratios) == (4, "bar")
  assert run([0.1, 0.2, 0.3, 0.4, 0.5], DEFAULT._replace(stop_at_bar=False), ratios=ratios) == (5, None)


def test_stops_at_a_target_ratio_for_a_partial_critic():
  """stop_at_ratio 0.45 (a partial critic): the first round whose *own* ratio reaches it (round 3:
  0.5), though the pooled window still lags (0.3); the bar is never reached.

  Breaks checked: the target read on the pooled ratio (round 4 stops, one round of learning late);
  read on the pooled interval's upper end (round 2 stops at an own ratio of 0.3)."""
  ratios = [(0.1, 0.0, 0.3, 0.1), (0.2, 0.1, 0.5, 0.3), (0.3, 0.2, 0.4, 0.5), (0.5, 0.4, 0.6, 0.7)]
  assert run([0.1, 0.2, 0.3, 0.4], DEFAULT._replace(stop_at_ratio=0.45), ratios=ratios) == (3, "ratio")


def test_smoothing_is_a_trailing_mean():
  """Break checked: the window ignored (no smoothing): the first assert fails."""
  assert vp_stop.smoothed([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
  now, best, since = vp_stop.plateau([0.0, 0.5, 0.4, 0.45], 1, 0.01)
  assert (now, best, since) == (0.45, 0.5, 2)


def test_pooled_ratio_of_a_critic_that_is_the_oracle():
  """Rounds' per-session statistics pooled: a critic equal to the oracle scores ratio 1 (interval
  [1, 1]); a critic at half the oracle's values (towards the mean) scores well below, and its
  interval brackets the pooled point. None where the oracle explains nothing."""
  rng = np.random.default_rng(0)
  stats_exact, stats_half = [], []
  for _ in range(3):
    v = rng.choice([0.3, 0.9], size=(128, 1)) * np.ones((1, 5))
    t = (rng.random((128, 1)) < v[:, :1]) * np.ones((1, 5))
    m = np.ones_like(t)
    stats_exact.append(cr.session_stats(v, t, m, v))
    stats_half.append(cr.session_stats(0.6 + 0.5 * (v - 0.6), t, m, v))
  r, lo, hi = vp_stop.pooled_ratio(stats_exact, boot=500, seed=0)
  assert r == pytest.approx(1.0) and lo == pytest.approx(1.0) and hi == pytest.approx(1.0)
  r, lo, hi = vp_stop.pooled_ratio(stats_half, boot=500, seed=0)
  assert 0.5 < r < 0.9 and lo < r < hi
  flat = [cr.session_stats(np.zeros((8, 2)), np.ones((8, 2)) * np.arange(8)[:, None], np.ones((8, 2)),
                           np.zeros((8, 2)))]
  assert vp_stop.pooled_ratio(flat, boot=100, seed=0) == (None, None, None)


def test_rule_of_reads_every_field():
  from mtrl_jax.config import base_config
  v = base_config().value_pretrain
  rule = vp_stop.rule_of(v)
  assert rule == Rule(int(v.steps), float(v.max_seconds), int(v.window), int(v.patience), float(v.min_delta),
                      bool(v.stop_at_bar), float(v.stop_at_ratio))
