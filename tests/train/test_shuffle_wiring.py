"""rl.shuffle_advantages (the study's positive control) reaches the learner's advantages."""
import numpy as np
import pytest

from tiny_world import learner, sessions_v0


@pytest.mark.slow
def test_shuffled_learner_trains_on_a_permutation_of_the_same_advantages():
  """With rl.shuffle_advantages the learner's advantages are the plain learner's, permuted over the action
  tokens (same sorted values, zeros off the mask), and not in the same places; a second update (version
  1) draws another permutation. Break checked: the learner ignoring the option (no shuffle) fails the
  'not in the same places' check; a key without the version repeats the permutation and fails the last."""
  sessions = list(sessions_v0())
  plain = learner(estimator="grpo")
  pb = plain._pack(sessions)
  zeros = np.zeros(pb.reward_bt.shape, np.float32)
  want = np.asarray(plain.advantages(pb, zeros)[0])
  lrn = learner(estimator="grpo", shuffle_advantages=True)
  got = np.asarray(lrn.advantages(pb, zeros)[0])
  mask = np.asarray(pb.loss_mask_bt) > 0
  assert np.all(got[~mask] == 0)
  np.testing.assert_allclose(np.sort(got[mask]), np.sort(want[mask]), rtol=1e-6)
  assert np.abs(got - want).max() > 0.1  # the pairing is broken
  lrn.version = 1
  again = np.asarray(lrn.advantages(pb, zeros)[0])
  assert np.abs(again - got).max() > 0.1
