"""result.json's agreement entries: every fraction with its item count and 95% Wilson interval
(credit_accuracy.score_estimator, split_scores), and the plot's error bars (error_bars)."""
import json

import numpy as np
import pytest

from mtrl_jax.lab import scores
from mtrl_jax.lab.credit_accuracy import error_bars, exit_table_lines, plot_points, score_estimator

# Items (session, turn) by distance: d=0 five items (4 significant), d=1 two (neither significant),
# d=2 three (all significant). Item 1 is an early exit.
A_STAR = np.array([1.0, -1.0, 0.5, 2.0, 0.01, 0.02, -0.02, 1.0, 1.0, -1.0])
SE = np.full(10, 0.1)
DIST = np.array([0, 0, 0, 0, 0, 1, 1, 2, 2, 2])
EST = np.array([1.0, 1.0, 1.0, 0.0, 5.0, -3.0, 3.0, 1.0, -1.0, -1.0])
EXIT = np.array([False, True, False, False, False, False, False, False, False, False])


def _ci(k, n):
  return [round(x, 4) for x in scores.wilson_interval(k, n)]


def test_score_estimator_counts_and_intervals():
  """d=0: 4 significant items, 2 agree (item 1 has the wrong sign, item 3 an estimate of 0);
  d=1: none; d=2: 3, 2 agree; overall 4 of 7. Catches an interval on the wrong counts (all items,
  or another distance's), an entry missing its count, intervals out of line with their distances
  (a None distance dropped from the list shifts the rest), and a result that is not valid JSON."""
  r = score_estimator(EST, A_STAR, SE, DIST, 2, np.tile(EST, (2, 1)), EXIT)
  r = json.loads(json.dumps(r, allow_nan=False))
  assert r["agreement"] == {"agreement": round(4 / 7, 4), "items": 7, "agree": 4, "wilson95": _ci(4, 7)}
  assert r["agreement_by_distance"] == [0.5, None, round(2 / 3, 4)]
  assert r["agreement_by_distance_items"] == [4, 0, 3]
  assert r["agreement_by_distance_wilson95"] == [_ci(2, 4), None, _ci(2, 3)]
  e = r["early_exit"]
  assert (e["agreement_exit"], e["significant_exit"], e["agreement_exit_wilson95"]) == (0.0, 1, _ci(0, 1))
  assert (e["agreement_carry_on"], e["significant_carry_on"]) == (round(4 / 6, 4), 6)
  assert e["agreement_carry_on_wilson95"] == _ci(4, 6)
  assert "early_exit" not in score_estimator(EST, A_STAR, SE, DIST, 2, np.tile(EST, (2, 1)), np.zeros(10, bool))


def test_no_significant_item_gives_no_fraction_and_no_interval():
  """Catches 0/0 reported as a fraction (NaN in the JSON) or as an interval [0, 1]."""
  r = score_estimator(EST, np.zeros(10), SE, DIST, 2, np.tile(EST, (2, 1)), EXIT)
  assert r["agreement"] == {"agreement": None, "items": 0, "agree": 0, "wilson95": None}
  assert r["agreement_by_distance_wilson95"] == [None, None, None]
  assert r["early_exit"]["agreement_exit_wilson95"] is None


def test_error_bars_follow_the_plotted_points():
  """Catches bars taken from the wrong distance once the empty ones are dropped (the bars must be
  the ones of plot_points' points) and the ends given as positions instead of distances from the
  point (matplotlib's yerr)."""
  agreement = [1.0, None, 0.25, None, 0.5]
  wilson = [[0.5, 1.0], None, [0.05, 0.7], None, [0.2, 0.8]]
  xs, ys = plot_points(agreement)
  below, above = error_bars(agreement, wilson)
  assert xs == [0, 2, 4]
  assert below == pytest.approx([0.5, 0.2, 0.3]) and above == pytest.approx([0.0, 0.45, 0.3])
  assert [y - b for y, b in zip(ys, below)] == pytest.approx([0.5, 0.05, 0.2])


def test_exit_table_prints_counts_and_intervals():
  """The early-exit table's head carries the stop / carry-on item counts (1 and 6 here) and each
  cell its Wilson interval. Catches the table printing the fractions alone or the counts of
  another split."""
  r = score_estimator(EST, A_STAR, SE, DIST, 2, np.tile(EST, (2, 1)), EXIT)
  lines = exit_table_lines({"estimators": {"grpo": r}})
  assert lines[0].startswith("| estimator | agreement stop (n=1) | agreement carry on (n=6) |")
  lo, hi = scores.wilson_interval(4, 6)
  assert lines[2].startswith(f"| grpo | 0.00 [0.00, {scores.wilson_interval(0, 1)[1]:.2f}] | "
                             f"{4 / 6:.2f} [{lo:.2f}, {hi:.2f}] |")
