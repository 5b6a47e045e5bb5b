"""return_to_go: discounted per-turn credit and its normalisations."""
import math

import numpy as np
import pytest
from hypothesis import given, settings

from credit_fixtures import jitted, random_sessions, seeds, to_batch, run
from mtrl_jax.credit import make_credit_batch

# Two sessions of one group, three turns each, one observation token before
# every turn and one action token per turn:
#   position  0  1  2  3  4  5
#   mask      0  1  0  1  0  1
#   turn      0  0  1  1  2  2
# Session A pays 1, 0, 2 on its turns; session B pays 0, 1, 0.
_MASK = np.tile(np.array([0, 1, 0, 1, 0, 1], np.float32), (2, 1))
_TURN = np.tile(np.array([0, 0, 1, 1, 2, 2], np.int32), (2, 1))
_REW = np.array([[0, 1, 0, 0, 0, 2], [0, 0, 0, 1, 0, 0]], np.float32)


def _batch():
  return make_credit_batch(_REW, _MASK, _TURN, group_id_b=np.array([4, 4]))


def test_raw_returns_hand_example():
  # gamma .5: G_A = [1 + .25*2, 0 + .5*2, 2] = [1.5, 1, 2];
  #           G_B = [0 + .5*1, 1, 0] = [.5, 1, 0].
  adv, tgt = run("return_to_go", _batch(), gamma=0.5, norm="none")
  np.testing.assert_allclose(adv, [[0, 1.5, 0, 1, 0, 2], [0, 0.5, 0, 1, 0, 0]])
  assert tgt is None


def test_default_gamma_is_one():
  # Undiscounted: G_A = [1 + 0 + 2, 0 + 2, 2] = [3, 2, 2]; G_B = [1, 1, 0].
  # Catches a changed default gamma (2.0 would give G_A[0] = 9).
  adv, _ = run("return_to_go", _batch(), norm="none")
  np.testing.assert_allclose(adv, [[0, 3, 0, 2, 0, 2], [0, 1, 0, 1, 0, 0]])


def test_group_turn_normalisation_with_ddof_one():
  # As below, but the variance is divided by n - 1 = 1 (two sessions):
  #   turn 0: (1.5, .5) -> dev +-.5, var .5, std sqrt(.5) -> +-sqrt(.5)
  #   turn 1: (1, 1)    -> 0, 0
  #   turn 2: (2, 0)    -> dev +-1, var 2, std sqrt 2     -> +-sqrt(.5)
  # Catches ddof not being passed on to the normalisation (ddof 0: +-1).
  adv, _ = run("return_to_go", _batch(), gamma=0.5, norm="group_turn", eps=0.0, ddof=1)
  h = math.sqrt(0.5)
  np.testing.assert_allclose(adv, [[0, h, 0, 0, 0, h], [0, -h, 0, 0, 0, -h]], rtol=1e-6,
                             atol=1e-6)


def test_group_turn_normalisation_hand_example():
  # Per turn index across the two sessions (eps 0):
  #   turn 0: (1.5, .5) -> mean 1, std .5 -> +1, -1
  #   turn 1: (1, 1)    -> 0, 0
  #   turn 2: (2, 0)    -> mean 1, std 1 -> +1, -1
  adv, _ = run("return_to_go", _batch(), gamma=0.5, norm="group_turn",
                              eps=0.0)
  np.testing.assert_allclose(adv, [[0, 1, 0, 0, 0, 1], [0, -1, 0, 0, 0, -1]], atol=1e-6)


def test_global_normalisation_hand_example():
  # All six G: 1.5, 1, 2, .5, 1, 0 -> mean 1; deviations .5, 0, 1, -.5, 0, -1;
  # var = (.25 + 1 + .25 + 1) / 6 = 2.5 / 6.
  std = math.sqrt(2.5 / 6)
  adv, _ = run("return_to_go", _batch(), gamma=0.5, norm="global", eps=0.0)
  expect = np.array([[0, .5, 0, 0, 0, 1], [0, -.5, 0, 0, 0, -1]]) / std
  np.testing.assert_allclose(adv, expect, rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(seed=seeds)
def test_group_turn_normalised_has_zero_mean_per_group_and_turn(seed):
  d = random_sessions(seed, n_groups=2)
  adv, _ = jitted("return_to_go", (("gamma", 0.8),))(to_batch(d))
  adv = np.asarray(adv)
  sums = {}
  for i in range(adv.shape[0]):
    m = d["loss_mask_bt"][i] > 0
    for k in set(d["turn_idx_bt"][i][m].tolist()):
      first = np.flatnonzero(m & (d["turn_idx_bt"][i] == k))[0]
      sums.setdefault((d["group_id_b"][i], k), []).append(adv[i, first])
  for key, vals in sums.items():
    assert abs(np.mean(vals)) < 1e-4, key


def test_rejects_unknown_norm():
  with pytest.raises(ValueError, match="norm"):
    run("return_to_go", _batch(), norm="per_token")
