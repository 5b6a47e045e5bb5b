"""hgpo's level weight: w_l = (l + 1)^alpha, l = the earlier turns a level's key
shares (issue 34; docs/credit.md says which weight the project means and why).

verl-agent's recipe code weights a level by (states in its key + 1)^alpha,
i.e. (l + 2)^alpha; the paper's nested groups G_0 ... G_K are indexed by the
shared history k, and the project weighs level k by (k + 1)^alpha. This test
pins the project's weight on a hand-worked example where the two differ.
"""
import numpy as np

from credit_fixtures import run
from mtrl_jax.credit import make_credit_batch

# Four 3-turn sessions of one task group, one observation + one action token per turn;
# all reach state s at turn 2, through the earlier states below; rewards only at turn 2.
A, B, C, D, S = 1, 2, 3, 4, 5
HISTORIES = [(A, B), (A, B), (C, B), (C, D)]
G = [1.0, 0.0, 0.4, 0.2]


def _batch():
  mask = np.tile(np.array([0, 1] * 3, np.float32), (4, 1))
  turn = np.tile(np.repeat(np.arange(3), 2).astype(np.int32), (4, 1))
  rew = np.zeros((4, 6), np.float32)
  rew[:, 5] = G
  state = np.array([np.repeat([h0, h1, S], 2) for h0, h1 in HISTORIES], np.int32)
  return make_credit_batch(rew, mask, turn, group_id_b=np.zeros(4, np.int32), state_id_bt=state)


def test_level_l_weighs_l_plus_1_to_the_alpha():
  """Turn 2, depth 2, alpha 2, gamma 1, mean-only, no episode term.
  Level 0 (state s: all four, mean 0.4): 0.6, -0.4, 0, -0.2.
  Level 1 (s after b: sessions 1-3, mean 0.4667): 0.5333, -0.4667, -0.0667; the 4th alone.
  Level 2 (s after a, b: sessions 1-2, mean 0.5): 0.5, -0.5; the others alone.
  Weights (l + 1)^2 = 1, 4, 9 over the levels where the turn has a group:
    A_1 = (0.6 + 4 x 0.5333 + 9 x 0.5) / 14 = 0.51667
    A_2 = (-0.4 - 4 x 0.4667 - 9 x 0.5) / 14 = -0.48333
    A_3 = (0 - 4 x 0.0667) / 5 = -0.05333
    A_4 = -0.2 (level 0 only).
  The recipe code's (l + 2)^2 = 4, 9, 16 would give 0.52414, -0.47586, then
  -0.06667 for the third (it also drops exactly-zero level advantages).

  Break checked (scratch edit of credit/step_groups.py::hgpo): the weight
  `(l + 2) ** alpha` gives 0.52414 for the first and fails; so does equal
  weighting (alpha ignored: 0.54444).
  """
  adv, _ = run("hgpo", _batch(), depth=2, alpha=2.0, gamma=1.0, episode_weight=0.0)
  want = [(0.6 + 4 * (1 - 1.4 / 3) + 9 * 0.5) / 14, (-0.4 - 4 * (1.4 / 3) - 9 * 0.5) / 14,
          (0.0 + 4 * (0.4 - 1.4 / 3)) / 5, -0.2]
  np.testing.assert_allclose(want, [0.516667, -0.483333, -0.053333, -0.2], atol=1e-6)  # the numbers above
  np.testing.assert_allclose(np.asarray(adv)[:, 5], want, rtol=1e-5, atol=1e-6)


def test_alpha_zero_averages_the_levels_equally():
  """alpha = 0: every level where the turn has a group weighs 1 (both readings of the
  weight agree here). A_1 = (0.6 + 0.5333 + 0.5) / 3 = 0.54444, A_3 = (0 - 0.0667) / 2."""
  adv, _ = run("hgpo", _batch(), depth=2, alpha=0.0, gamma=1.0, episode_weight=0.0)
  np.testing.assert_allclose(np.asarray(adv)[:, 5], [(0.6 + (1 - 1.4 / 3) + 0.5) / 3,
                                                     (-0.4 - 1.4 / 3 - 0.5) / 3, (0.4 - 1.4 / 3) / 2, -0.2],
                             rtol=1e-5, atol=1e-6)
