"""The lab's scoring math on hand-made items."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrl_jax.lab import scores
from mtrl_jax.lab.credit_accuracy import bootstrap, ground_truth
from mtrl_jax.rollout.session import Session, make_turn


def test_agreement_counts_only_significant_items_per_distance():
  """Catches counting insignificant items, a zero estimate counted as agreeing,
  and distances mixed up."""
  a_star = np.array([1.0, -1.0, 0.1, 1.0, -2.0])
  se = np.array([0.1, 0.1, 0.1, 0.1, 0.1])  # item 2 is not significant
  est = np.array([0.5, 0.3, -9.0, 0.0, -1.0])
  dist = np.array([0, 0, 0, 1, 2])
  frac, count = scores.agreement_by_distance(est, a_star, se, dist, 3)
  assert count == [2, 1, 1, 0]
  assert frac == [0.5, 0.0, 1.0, None]


def test_deterministic_rounding_size_advantage_is_not_significant():
  """Catches counting an exactly-known A* of float-rounding size as significant:
  with the randomness drawn at reset (bifurcation), every continuation returns the
  same, se is 0 and A* = r + V' - V is ~1e-16 at the echo turns, yet a real
  deterministic advantage (0.1, se 0) still counts."""
  r = np.float64(0.1)
  v_next, v = np.float64(0.7), np.float64(0.8)
  a_star = np.array([r + v_next - v, 0.1, -0.25])  # the first is 0 up to rounding
  assert a_star[0] != 0.0
  se = np.zeros(3)
  assert scores.significant(a_star, se).tolist() == [False, True, True]
  _, count = scores.agreement_by_distance(np.ones(3), a_star, se, np.array([1, 1, 0]), 1)
  assert count == [1, 1]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=3, max_size=20), st.floats(0.1, 10))
def test_rank_corr_and_bias_are_scale_free(xs, scale):
  """Any positive rescaling of an estimate keeps its rank correlation (1 with
  itself) and its normalised bias (0 against itself)."""
  x = np.array(xs)
  if np.ptp(x) < 1e-6:  # a (numerically) constant estimate has no ranks; 5.8e-230 squared underflows to 0
    return
  assert abs(scores.rank_corr(scale * x, x) - 1.0) < 1e-9
  assert abs(scores.normalised_bias(scale * x, x)) < 1e-9
  # An offset is seen: a zero-mean x shifted by its rms has normalised bias 1/sqrt(2).
  # (Not x itself: with a large mean, a shift by rms barely changes mean/rms, e.g. [1, 1, 2].)
  z = x - x.mean()
  assert abs(scores.normalised_bias(z + np.sqrt(np.mean(z ** 2)), z) - 1 / np.sqrt(2)) < 1e-6


def test_resample_variance():
  """0 when every resample gives the item the same value; positive otherwise."""
  est = np.array([1.0, -1.0, 2.0])
  same = np.tile(est, (4, 1))
  same[1, 2] = np.nan  # item 2 not drawn in resample 1
  assert scores.resample_variance(same, est) == 0.0
  noisy = same + np.array([[0.0], [1.0], [0.0], [-1.0]])
  assert scores.resample_variance(noisy, est) > 0.1


def _session(sid, rewards):
  s = Session(session_id=sid, task_id=0, group_id=sid // 2, seed=0, env_name="x")
  for r in rewards:
    s.turns.append(make_turn("o", [1], "a", [2], [0.0], 0, r))
  s.finish("terminated")
  return s


def test_ground_truth_is_reward_plus_next_value_minus_value():
  """A*_t = r_t + V_{t+1} - V_t with V after the last turn 0, and the standard
  errors add in quadrature. Catches an off-by-one in the value alignment."""
  s = _session(0, [0.5, 1.0])
  v_sk = np.array([[2.0, 2.0], [1.0, 3.0]])  # V(h_0) = 2 (se 0), V(h_1) = 2 (se = sample std sqrt 2 / sqrt 2 = 1)
  a_star, se = ground_truth([s], v_sk)
  np.testing.assert_allclose(a_star[0], [0.5 + 2 - 2, 1.0 + 0 - 2])
  np.testing.assert_allclose(se[0], [1.0, 1.0])


def test_bootstrap_draws_within_groups():
  ss = [_session(i, [1.0]) for i in range(6)]
  idx = bootstrap(ss, np.random.default_rng(0))
  assert len(idx) == 6
  assert sorted(ss[j].group_id for j in idx) == [0, 0, 1, 1, 2, 2]
