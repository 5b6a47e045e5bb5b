"""The lab's walkthrough split (lab/plan_split.py) on hand-made items."""
from types import SimpleNamespace

import numpy as np

from mtrl_jax.lab import plan_split


def _sessions(flags):
  return [SimpleNamespace(turns=[SimpleNamespace(info={} if f is None else {"on_plan": f}) for f in fs])
          for fs in flags]


def test_plan_mask_reads_the_turns_in_item_order_and_is_none_without_marks():
  """Break checked: reading `early_exit` instead of `on_plan` (or sessions in reverse) fails the mask."""
  assert plan_split.plan_mask(_sessions([[None, None], [None]])) is None
  assert plan_split.plan_mask(_sessions([[True, False], [True]])).tolist() == [True, False, True]


def test_an_estimator_that_credits_the_plan_scores_one_on_it_and_one_that_inverts_scores_zero():
  """On-plan items with A* > 0, off-plan with A* < 0 (all significant): an estimate equal to A* agrees
  on both and credits every on-plan turn; its negation agrees on none and credits only off-plan turns.

  Break checked: swapping the masks of the two labels (on_plan scored on ~plan_i) fails the counts.
  """
  a_star = np.array([1.0, 0.8, -0.5, -0.9, 0.6])
  se = np.full(5, 0.1)
  plan = np.array([True, True, False, False, True])
  good = plan_split.plan_scores(a_star, a_star, se, plan)
  assert good["on_plan"]["turns"] == 3 and good["off_plan"]["turns"] == 2
  assert good["on_plan"]["agreement"] == 1.0 and good["off_plan"]["agreement"] == 1.0
  assert good["on_plan"]["credited"] == 1.0 and good["off_plan"]["credited"] == 0.0
  bad = plan_split.plan_scores(-a_star, a_star, se, plan)
  assert bad["on_plan"]["agreement"] == 0.0 and bad["on_plan"]["credited"] == 0.0
  assert bad["off_plan"]["credited"] == 1.0
  assert good["on_plan"]["mean_estimate"] > 0 > bad["on_plan"]["mean_estimate"]
  lo, hi = good["on_plan"]["agreement_wilson95"]
  assert 0.4 < lo < 1.0 == hi
  lines = plan_split.plan_table_lines({"estimators": {"x": {"walkthrough": good}, "y": {"walkthrough": bad}}})
  assert lines[0].startswith("| estimator | agreement on-plan (n=3)") and len(lines) == 4
