"""The staleness queue's edges that mutation testing found untested (docs/mutation.md).

Each test names, in its docstring, the break it catches (checked by hand in a
scratch copy: it fails with the break and passes without). Every call here
either returns at once or times out at once (timeout=0: the deadline has
passed before the first wait), so nothing depends on thread timing.
"""
import re

import numpy as np
import pytest

from mtrl_jax.rollout.session import Session, make_turn
from mtrl_jax.rollout.staleness_queue import InvariantError, StalenessQueue


def sess(sid, version):
  """A finished session with one turn whose one generated token has `version`."""
  s = Session(session_id=sid, task_id=0, group_id=0, seed=0, env_name="fake")
  s.turns.append(make_turn("o", [3], "a", [9], [-1.0], np.asarray([version]), 0.0))
  s.finish("terminated")
  return s


def grp(*versions):
  """A group: one session per version."""
  return [sess(i, v) for i, v in enumerate(versions)]


def add(q, group):
  t = q.admit(1, timeout=0)
  q.put(t, [group], timeout=0)
  return t


def exact(message):
  return "^" + re.escape(message) + "$"


def test_a_new_queue_reports_closed_as_false():
  """Catches the closed flag starting as None instead of False (falsy, but
  `closed` is documented as a bool)."""
  q = StalenessQueue(eta=0, groups_per_update=1)
  assert q.closed is False


def test_dropped_sessions_add_up_over_separate_gets():
  """Catches the dropped-session count being overwritten by each drop
  (`= sessions` instead of `+= sessions`)."""
  q = StalenessQueue(eta=1, groups_per_update=1)
  add(q, grp(0, 0))      # two sessions of version 0
  with pytest.raises(TimeoutError):
    q.get(version=2, timeout=0)  # staleness 2 > eta: dropped, then nothing left to take
  assert q.counts().dropped_sessions == 2
  add(q, grp(0, 0, 0))   # three more, as stale
  with pytest.raises(TimeoutError):
    q.get(version=2, timeout=0)
  c = q.counts()
  assert (c.dropped, c.dropped_sessions) == (2, 5)


def test_put_on_a_full_queue_times_out_naming_put():
  """Catches put's timeout naming another call (`_wait(deadline, None)`, 'XXputXX' or
  'PUT'): the message must say put timed out."""
  q = StalenessQueue(eta=3, groups_per_update=1, max_queued_groups=1)
  add(q, grp(0))
  t = q.admit(1, timeout=0)
  with pytest.raises(TimeoutError, match=exact("StalenessQueue.put: timed out")):
    q.put(t, [grp(0)], timeout=0)
  assert q.counts().queued == 1 and q.counts().in_flight == 1


def test_budget_message_counts_live_groups_net_of_drops_and_abandons():
  """Catches the live count in the budget message adding dropped or abandoned groups
  instead of subtracting them (started + dropped - abandoned, started - dropped + abandoned)."""
  q = StalenessQueue(eta=0, groups_per_update=1, max_attempts=1)
  assert q.retry(q.admit(1, timeout=0)) is False  # abandoned: 1
  add(q, grp(0))
  with pytest.raises(TimeoutError):
    q.get(version=1, timeout=0)                  # dropped: 1
  c = q.counts()
  assert (c.started, c.dropped, c.abandoned, c.budget) == (2, 1, 1, 1)
  q._started += 2  # break the bound by hand: live = 4 - 1 - 1 = 2 > 1
  q._in_flight += 2
  with pytest.raises(InvariantError, match=exact(
      "live groups 2 exceed the admission budget (eta=0 + published=0 + 1) x T=1 = 1")):
    q.assert_invariant()


def test_staleness_of_a_batch_without_sessions_is_an_empty_int64_array():
  """Catches the staleness array left to numpy's default dtype (np.asarray(..., None)):
  a batch whose groups hold no session would give float64."""
  q = StalenessQueue(eta=0, groups_per_update=1)
  add(q, [])
  b = q.get(timeout=0)
  assert b.staleness_b.shape == (0,) and b.staleness_b.dtype == np.int64
  assert b.sessions == []
