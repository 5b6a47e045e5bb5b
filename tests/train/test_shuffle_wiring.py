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


def test_decision_scope_moves_only_turn_0_credit_between_sessions_on_a_fraction_of_them():
  """rl.shuffle_scope 'decision' with rl.shuffle_fraction 0.5: every token off turn 0 keeps the plain
  learner's advantage; on turn 0 the sessions' advantages are the same multiset, and at most half
  the sessions' differ from their own: exactly half (returns made distinct, so no donor ties);
  each update draws anew. Quick: the plain learner's program is shared with the test above.

  Breaks checked: the learner ignoring the scope (the all-token shuffle runs) fails 'off turn 0
  untouched'; the fraction not passed through (1.0 used in credit(), or CreditSetup.from_config not
  reading rl.shuffle_fraction) fails 'exactly half'; the key without the policy version fails 'a new
  draw per update'."""
  pb = pack_sessions(list(sessions_v0()))
  # Distinct returns within and across the two groups (grpo reads return_b): no two sessions tie.
  pb = pb._replace(return_b=np.where(pb.sample_valid_b > 0, np.arange(len(pb.return_b)) ** 2, 0).astype(np.float32))
  zeros = np.zeros(pb.reward_bt.shape, np.float32)
  want = np.asarray(learner(estimator="grpo").advantages(pb, zeros)[0])
  lrn = learner(estimator="grpo", shuffle_advantages=True, shuffle_scope="decision", shuffle_fraction=0.5)
  dec = (np.asarray(pb.loss_mask_bt) > 0) & (np.asarray(pb.turn_idx_bt) == 0)
  rows = np.nonzero(dec.any(1))[0]
  assert len(rows) == 8 and (~dec & (np.asarray(pb.loss_mask_bt) > 0)).any()  # sessions with later turns
  first = lambda a: np.array([a[r, dec[r]][0] for r in rows])  # grpo: one value over a session's turn 0
  moved = []
  for version in range(6):
    lrn.version = version
    got = np.asarray(lrn.advantages(pb, zeros)[0])
    np.testing.assert_array_equal(got[~dec], want[~dec])
    np.testing.assert_allclose(np.sort(first(got)), np.sort(first(want)), rtol=1e-6)
    moved.append(first(got) != first(want))
    assert moved[-1].sum() == 4
  assert len({tuple(m) for m in moved}) >= 3  # a new draw of sessions per update
