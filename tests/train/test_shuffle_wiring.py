"""rl.shuffle_advantages (the study's positive control) reaches the learner's advantages, and each
update (policy version) draws its own permutation."""
import numpy as np

from mtrl_jax.rollout.packing import pack_sessions
from tiny_world import learner, sessions_v0


def test_shuffled_learner_trains_on_a_new_permutation_of_the_same_advantages_each_update():
  """With rl.shuffle_advantages the learner's advantages are the plain learner's, permuted over the
  action tokens (same sorted values, zeros off the mask), not in the same places; at the next policy
  version (the next update) they are permuted again, differently; at the same version, the same way.
  Quick: the two learners share one compiled advantage program (the shuffle runs outside it).

  Breaks checked: the learner ignoring the option (no shuffle) fails 'not in the same places'; the
  shuffle key without the policy version (`jax.random.key(seed + 31)` alone in train/learner.py: the
  same permutation every update, the control then only relabels a fixed token order) fails the
  version-1 check."""
  sessions = list(sessions_v0())
  pb = pack_sessions(sessions)
  zeros = np.zeros(pb.reward_bt.shape, np.float32)
  want = np.asarray(learner(estimator="grpo").advantages(pb, zeros)[0])
  lrn = learner(estimator="grpo", shuffle_advantages=True)
  got = np.asarray(lrn.advantages(pb, zeros)[0])
  mask = np.asarray(pb.loss_mask_bt) > 0
  assert np.ptp(want[mask]) > 1.0  # advantages that differ: a permutation shows
  assert np.all(got[~mask] == 0)
  np.testing.assert_allclose(np.sort(got[mask]), np.sort(want[mask]), rtol=1e-6)
  assert np.abs(got - want).max() > 0.1  # the pairing is broken
  np.testing.assert_array_equal(np.asarray(lrn.advantages(pb, zeros)[0]), got)  # one version, one draw
  lrn.version = 1
  again = np.asarray(lrn.advantages(pb, zeros)[0])
  np.testing.assert_allclose(np.sort(again[mask]), np.sort(want[mask]), rtol=1e-6)
  assert np.abs(again - got).max() > 0.1
