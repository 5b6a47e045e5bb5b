"""rl.shuffle_scope 'decision' (the graded positive control, issue 41) reaches the learner's advantages:
only turn 0's credit moves, on the configured fraction of the sessions, drawn anew each update."""
import numpy as np

from mtrl_jax.rollout.packing import pack_sessions
from tiny_world import learner, sessions_v0


def test_decision_scope_moves_only_turn_0_credit_between_sessions_on_a_fraction_of_them():
  """rl.shuffle_scope 'decision' with rl.shuffle_fraction 0.5: every token off turn 0 keeps the plain
  learner's advantage; on turn 0 the sessions' advantages are the same multiset, and exactly half
  the sessions' differ from their own (returns made distinct, so no donor ties); each update draws
  anew. Quick: the plain learner's program is shared with tests/train/test_shuffle_wiring.py.

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
