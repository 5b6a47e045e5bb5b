"""rl.shuffle_scope 'decision' (the graded positive control, issue 41) reaches the learner's advantages:
only turn 0's credit moves, on the configured fraction of the sessions, drawn anew each update."""
import copy
import dataclasses

import numpy as np
import pytest

from mtrl_jax.rollout.packing import pack_sessions
from mtrl_jax.train import credit_step
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


@pytest.mark.parametrize("layout", ["session", "turn"])
def test_an_invalid_decision_reply_keeps_its_credit_through_the_update(monkeypatch, layout):
  """Through Learner.update (the training path: sessions packed inside update): with the graded control
  at q = 1, the 3 sessions whose turn-0 reply the env called invalid keep the plain advantages (the
  same batch's, credit computed without the control) bit for bit on every token; all 5 valid sessions'
  turn-0 credit is handed round among themselves (each differs from its own, same multiset); the
  update reports 5 eligible of 8. Both layouts: one row per session, and one row per turn (history).

  Breaks checked: the flag dropped in packing (`invalid` left all False) fails 'invalid keep theirs'
  (they are drawn); the turn layout's history rows packed without it fails the [turn] case; credit_step
  calling the shuffle without `eligible_b` fails 'invalid keep theirs'; the eligibility read from the
  last turn's flags (`decision_turn=1` in valid_decision_rows) fails it too."""
  sessions = copy.deepcopy(list(sessions_v0()))
  bad = {1, 4, 6}
  for i, s in enumerate(sessions):  # distinct returns (no donor ties); turn 0 invalid on `bad`
    s.turns[-1] = s.turns[-1]._replace(reward=float(i) ** 1.5)
    s.turns[0] = s.turns[0]._replace(invalid_action=i in bad)
  assert all(s.num_turns == 2 for s in sessions)  # a later turn, whose credit must stay
  seen = []
  real = credit_step.credit

  def spy(setup, pb, *args, **kw):
    out = real(setup, pb, *args, **kw)
    plain = real(dataclasses.replace(setup, shuffle=False), pb, *args, **kw)
    seen.append((pb, np.asarray(out.adv_bt), np.asarray(plain.adv_bt), out.stats))
    return out

  monkeypatch.setattr(credit_step, "credit", spy)
  lrn = learner(estimator="grpo", layout=layout, shuffle_advantages=True, shuffle_scope="decision",
                shuffle_fraction=1.0)
  met = lrn.update(sessions, 0)
  (pb, got, want, stats), = seen
  assert met["credit/shuffle_eligible"] == 5 and stats["credit/shuffle_eligible_fraction"] == 5 / 8
  sess_b = np.asarray(pb.session_index_b)
  dec = (np.asarray(pb.loss_mask_bt) > 0) & (np.asarray(pb.turn_idx_bt) == 0)
  invalid_rows = np.isin(sess_b, list(bad))
  np.testing.assert_array_equal(got[invalid_rows], want[invalid_rows])
  np.testing.assert_array_equal(got[~dec], want[~dec])  # turn 1 and padding: untouched
  rows = np.nonzero(dec.any(1) & ~invalid_rows)[0]
  assert len(rows) == 5
  first = lambda a: np.array([a[r, dec[r]][0] for r in rows])
  assert np.all(first(got) != first(want))
  np.testing.assert_array_equal(np.sort(first(got)), np.sort(first(want)))
