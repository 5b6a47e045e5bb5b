"""The staleness queue step by step: exact tickets, counts, staleness, messages
and wake-ups, in scenarios whose outcome does not depend on thread timing.

test_staleness_queue.py checks the bound and the accounting under random
timing; these tests pin each rule on a hand-made sequence of calls, so a
slip in one rule fails here on every run (a fuzz run may not reach it).
Blocking is checked in two ways that a loaded machine cannot turn into a
false failure: a call that must time out runs in a helper thread and is
given ample time to raise (a call that never gives up fails the test
instead of hanging it), and a waiter that must be woken is first seen
blocked on the queue's condition (its waiter list), then woken, then given
seconds to return although it had a 60-second deadline.

Found by mutation testing (docs/mutation.md): the queue's counters, messages,
defaults and boundary comparisons had no direct test. Breaks checked by hand
in a scratch copy: `free >= 1` -> `free >= 2` in admit, `version - v > eta`
-> `>=` in the stale filter, `self._abandoned += k` -> `= k`, publish
rejecting an equal version (`<=`), the poll `_cv.wait(_POLL_S)` ->
`_cv.wait(None)` (a Ctrl-C delivered to another thread then never reaches
the main thread), and `left <= 0` -> `left <= 1` in `_wait`.
"""
import re
import signal
import threading
import time

import numpy as np
import pytest

from mtrl_jax.rollout.session import Session, make_turn
from mtrl_jax.rollout.staleness_queue import (Batch, Group, InvariantError, QueueClosed, StalenessQueue,
                                              Ticket, group_min_version)

LONG = 60.0   # a deadline no test should reach
GRACE = 10.0  # how long a woken waiter, or a call that must time out, may take


def sess(sid, *turns):
  """A session with one turn per argument: a version, or a list of per-token versions."""
  s = Session(session_id=sid, task_id=0, group_id=0, seed=0, env_name="fake")
  for v in turns:
    v = np.atleast_1d(np.asarray(v))
    s.turns.append(make_turn("o", [3], "a", [9] * v.size, [-1.0] * v.size, v, 0.0))
  s.finish("terminated")
  return s


def grp(*sessions_turns):
  """A group: one session per argument, each a list of turn versions."""
  return [sess(i, *turns) for i, turns in enumerate(sessions_turns)]


def admit(q, n=1):
  """q.admit that must succeed at once (a slip that blocks it fails after GRACE s, not never)."""
  return q.admit(n, timeout=GRACE)


def get(q, **kw):
  return q.get(timeout=GRACE, **kw)


def put(q, ticket, groups, **kw):
  return q.put(ticket, groups, timeout=GRACE, **kw)


def add(q, *groups):
  """Admits one ticket for len(groups) groups and puts them."""
  t = admit(q, len(groups))
  assert t.num_groups == len(groups), t
  put(q, t, list(groups))
  return t


def exact(message):
  return "^" + re.escape(message) + "$"


def outcome_in_thread(fn, timeout=GRACE):
  """Runs fn in a thread; returns ('returned', value) / ('raised', exc) / ('running', None)."""
  box = []

  def run():
    try:
      box.append(("returned", fn()))
    except BaseException as e:  # noqa: BLE001 (reported to the test)
      box.append(("raised", e))

  th = threading.Thread(target=run, daemon=True)
  th.start()
  th.join(timeout)
  return box[0] if box else ("running", None)


def times_out(q, fn, what, timeout=0.05):
  """fn(timeout) raises TimeoutError naming `what`, and not before `timeout` seconds."""
  t0 = time.monotonic()
  kind, val = outcome_in_thread(lambda: fn(timeout))
  took = time.monotonic() - t0
  if kind == "running":
    q.close()  # let the stuck call end
  assert kind == "raised" and isinstance(val, TimeoutError), (kind, val)
  assert str(val) == f"StalenessQueue.{what}: timed out"
  assert took >= timeout, took  # it did not give up before its deadline


def wait_until_blocked(q, n=1):
  end = time.monotonic() + GRACE
  while len(q._cv._waiters) < n:  # threads inside q._cv.wait
    assert time.monotonic() < end, "the waiter never blocked"
    time.sleep(0.001)


def woken(q, call, action):
  """call() blocks; after action() it must return well before its 60 s deadline."""
  box = []

  def run():
    try:
      box.append(("returned", call()))
    except BaseException as e:  # noqa: BLE001
      box.append(("raised", e))

  th = threading.Thread(target=run, daemon=True)
  th.start()
  wait_until_blocked(q)
  action()
  th.join(GRACE)
  alive = th.is_alive()
  if alive:
    q.close()
  assert not alive, "the waiter was not woken"
  return box[0]


# ------------------------------------------------------------------ options
def test_options_are_checked_with_exact_messages():
  for eta in (1.5, -1):
    with pytest.raises(ValueError, match=exact(f"StalenessQueue.eta must be an integer >= 0, got {eta!r}")):
      StalenessQueue(eta=eta, groups_per_update=1)
  with pytest.raises(ValueError, match=exact("StalenessQueue.groups_per_update must be >= 1, got 0")):
    StalenessQueue(eta=0, groups_per_update=0)
  for chunk in (0, 3):
    with pytest.raises(ValueError, match=exact("StalenessQueue.max_chunk must be in [1, groups_per_update=2], "
                                               f"got {chunk}")):
      StalenessQueue(eta=0, groups_per_update=2, max_chunk=chunk)
  with pytest.raises(ValueError, match=exact(
      "StalenessQueue.max_queued_groups=3 must be >= groups_per_update + max_chunk - 1 = 4, or producers "
      "could block while the learner waits")):
    StalenessQueue(eta=0, groups_per_update=3, max_chunk=2, max_queued_groups=3)
  with pytest.raises(ValueError, match=exact("StalenessQueue.max_attempts must be >= 1, got 0")):
    StalenessQueue(eta=0, groups_per_update=1, max_attempts=0)
  # The edges are allowed.
  StalenessQueue(eta=0, groups_per_update=1, max_attempts=1)
  StalenessQueue(eta=2.0, groups_per_update=2, max_chunk=2, max_queued_groups=3)
  StalenessQueue(eta=0, groups_per_update=2, max_chunk=1)


@pytest.mark.parametrize("eta,t,chunk,want", [(1, 3, 3, 6), (0, 2, 2, 3), (2, 1, 1, 3)])
def test_default_queue_size_is_eta_plus_one_batches_or_the_floor(eta, t, chunk, want):
  q = StalenessQueue(eta=eta, groups_per_update=t, max_chunk=chunk)
  assert q.max_queued == want
  for n in (want + 1, 0):
    with pytest.raises(ValueError, match=exact(f"get: n must be in [1, max_queued_groups={want}], got {n}")):
      q.get(n=n, timeout=GRACE)
  times_out(q, lambda s: q.get(n=want, timeout=s), "get")  # n = max_queued is a valid request


def test_defaults():
  q = StalenessQueue(eta=0, groups_per_update=1)
  c = q.counts()
  assert (c.version, c.published, c.budget) == (0, 0, 1)
  t = admit(q, 1)
  assert t == Ticket(0, 1, 0) and list(t.groups) == [0]
  for n in (2, 0):
    with pytest.raises(ValueError, match=exact(f"admit: n must be in [1, max_chunk=1], got {n}")):
      q.admit(n, timeout=GRACE)
  # max_attempts 3: two replays, then abandoned
  assert q.retry(t)
  t = admit(q, 1)
  assert q.retry(t)
  t = admit(q, 1)
  assert t.attempt == 2 and not q.retry(t)


def test_first_group_and_start_version():
  q = StalenessQueue(eta=1, groups_per_update=2, max_chunk=2, first_group=40, version=7)
  t = admit(q, 2)
  assert list(t.groups) == [40, 41]
  put(q, t, [grp([6]), grp([7, 7])])
  b = get(q)  # measured against the start version 7
  assert b.version == 7 and b.staleness_b.tolist() == [1, 0]
  assert [g.index for g in b.groups] == [40, 41]


# ---------------------------------------------------------------- admission
def test_admission_counts_step_by_step():
  """eta 1, T 2, chunks of 2: budget (1 + P + 1) * 2; a ticket near the bound is cut."""
  q = StalenessQueue(eta=1, groups_per_update=2, max_chunk=2)
  a = admit(q, 1)
  b = admit(q, 2)
  c = admit(q, 2)  # 3 started, budget 4: one group left
  assert (a, b, c) == (Ticket(0, 1), Ticket(1, 2), Ticket(3, 1))
  assert q.counts()[:7] == (4, 4, 0, 0, 0, 0, 0)  # started .. abandoned
  times_out(q, lambda s: q.admit(1, timeout=s), "admit")
  put(q, b, [grp([0]), grp([0])], metas=[{"x": 1}, {"x": 2}])
  put(q, a, [grp([0])])
  c1 = q.counts()
  assert (c1.started, c1.in_flight, c1.produced, c1.queued, c1.budget) == (4, 1, 3, 3, 4)
  batch = get(q)
  assert [g.index for g in batch.groups] == [1, 2] and [g.meta for g in batch.groups] == [{"x": 1}, {"x": 2}]
  assert q.unpublished_batches == 1
  times_out(q, lambda s: q.admit(1, timeout=s), "admit")  # taken but not published: still closed
  q.publish(1)
  assert q.unpublished_batches == 0
  c2 = q.counts()
  assert (c2.published, c2.batches_taken, c2.budget, c2.consumed, c2.queued, c2.version) == (1, 1, 6, 2, 1, 1)
  assert admit(q, 2) == Ticket(4, 2)
  times_out(q, lambda s: q.admit(1, timeout=s), "admit")
  q.assert_invariant()


def test_get_of_fewer_groups_than_a_batch():
  q = StalenessQueue(eta=0, groups_per_update=2, max_chunk=2)
  add(q, grp([0]), grp([0]))
  assert [g.index for g in get(q, n=1).groups] == [0]
  assert [g.index for g in get(q, n=1).groups] == [1]
  assert q.unpublished_batches == 2


def test_retry_hands_the_same_ticket_out_first():
  q = StalenessQueue(eta=1, groups_per_update=2, max_chunk=2, max_attempts=3)
  t = admit(q, 2)
  admit(q, 1)
  assert q.retry(t)
  assert q.counts().in_flight == 3  # a ticket waiting for its replay is still in flight
  t1 = admit(q, 1)  # the replay comes first, whatever n asks
  assert t1 == Ticket(0, 2, 1)
  with pytest.raises(ValueError, match=exact(f"retry: ticket {t} is not in flight")):
    q.retry(t)  # the earlier hand-out
  assert q.retry(t1)
  t2 = admit(q, 2)
  assert t2 == Ticket(0, 2, 2)
  assert not q.retry(t2)  # third hand-out: abandoned, its slots freed
  c = q.counts()
  assert (c.abandoned, c.in_flight, c.started) == (2, 1, 3)
  assert admit(q, 2) == Ticket(3, 2)  # live 1 of budget 4
  q.assert_invariant()


def test_abandoned_tickets_add_up_and_free_their_slots():
  q = StalenessQueue(eta=0, groups_per_update=2, max_chunk=2, max_attempts=1)
  a, b = admit(q, 1), admit(q, 1)
  times_out(q, lambda s: q.admit(1, timeout=s), "admit")
  assert not q.retry(a) and not q.retry(b)
  c = q.counts()
  assert (c.abandoned, c.in_flight, c.started) == (2, 0, 2)
  assert admit(q, 2) == Ticket(2, 2)


def test_put_checks_its_ticket_and_keeps_metas_in_order():
  q = StalenessQueue(eta=0, groups_per_update=2, max_chunk=2)
  t = admit(q, 2)
  with pytest.raises(ValueError, match=exact("put: ticket 0 covers 2 groups, got 1")):
    put(q, t, [grp([0])])
  with pytest.raises(ValueError, match=exact("put: 1 metas for 2 groups")):
    put(q, t, [grp([0]), grp([0])], metas=[{}])
  stale = Ticket(0, 2, 1)
  with pytest.raises(ValueError, match=exact(f"put: ticket {stale} is not in flight (already put, retried or "
                                             "never admitted)")):
    put(q, stale, [grp([0]), grp([0])])
  groups = [grp([0], [0]), grp([0])]
  put(q, t, groups, metas=({"a": 1}, {"b": 2}))
  b = get(q)
  assert isinstance(b, Batch) and all(isinstance(g, Group) for g in b.groups)
  assert [(g.index, g.meta, g.sessions) for g in b.groups] == [(0, {"a": 1}, groups[0]), (1, {"b": 2}, groups[1])]
  assert b.sessions == groups[0] + groups[1]
  assert [g.meta for g in b.groups] == [{"a": 1}, {"b": 2}]


# ---------------------------------------------------------------- staleness
def test_staleness_at_the_bound_is_kept_and_beyond_it_dropped():
  """eta 2 at learner version 5: oldest version 3 (staleness 2) is kept, 2 is dropped with its group."""
  q = StalenessQueue(eta=2, groups_per_update=1)
  add(q, grp([[2, 5]]))                    # one session, a token of version 2: stale
  add(q, grp([3], [5]))                    # two sessions: staleness 2 and 0
  add(q, grp([4], [[5, 3]], [5], [5, 5]))   # four sessions: 1, 2, 0, 0
  b = get(q, version=5)
  assert [g.index for g in b.groups] == [1]
  assert (b.dropped_groups, b.dropped_sessions, b.version) == (1, 1, 5)
  assert b.staleness_b.tolist() == [2, 0]
  b = get(q, version=5)
  assert b.staleness_b.tolist() == [1, 2, 0, 0] and (b.dropped_groups, b.dropped_sessions) == (0, 0)
  c = q.counts()
  assert (c.dropped, c.dropped_sessions, c.consumed, c.queued) == (1, 1, 2, 0)


def test_one_pass_drops_several_groups_and_sessions_without_tokens_stay():
  q = StalenessQueue(eta=2, groups_per_update=1)
  add(q, grp([0], [0], [1]))  # 3 sessions, oldest version 0: stale at 3
  add(q, grp([0]))            # 1 session, stale
  add(q, grp([], []))         # no generated token: never stale, staleness 0
  assert group_min_version(q._ready[2].sessions) is None
  assert group_min_version(q._ready[0].sessions) == 0
  b = get(q, version=3)
  assert [g.index for g in b.groups] == [2]
  assert (b.dropped_groups, b.dropped_sessions) == (2, 4)
  assert b.staleness_b.tolist() == [0, 0] and b.staleness_b.dtype == np.int64
  c = q.counts()
  assert (c.dropped, c.dropped_sessions, c.queued, c.consumed) == (2, 4, 0, 1)


def test_dropped_groups_free_admission_slots_for_a_blocked_producer():
  q = StalenessQueue(eta=0, groups_per_update=1)
  add(q, grp([0]))
  kind, t = woken(q, lambda: q.admit(1, timeout=LONG),
                  lambda: times_out(q, lambda s: q.get(version=1, timeout=s), "get"))
  assert kind == "returned" and t == Ticket(1, 1)


def test_publish_needs_a_version_at_least_the_last():
  q = StalenessQueue(eta=0, groups_per_update=1, version=3)
  q.publish(3)  # the same version again is fine (an update that left the policy unchanged)
  with pytest.raises(ValueError, match=exact("publish: version 2 is older than the published 3")):
    q.publish(2)
  q.publish(5)
  assert q.counts().version == 5


def test_get_reports_the_time_it_waited():
  q = StalenessQueue(eta=0, groups_per_update=1)

  def late_put():
    wait_until_blocked(q)
    time.sleep(0.2)
    add(q, grp([0]))

  th = threading.Thread(target=late_put, daemon=True)
  th.start()
  t0 = time.perf_counter()
  b = q.get(timeout=GRACE)
  outer = time.perf_counter() - t0
  th.join(GRACE)
  assert 0.2 <= b.waited_s <= outer


# --------------------------------------------------------------- wake-ups
def test_a_put_wakes_a_blocked_get():
  q = StalenessQueue(eta=0, groups_per_update=1)
  kind, b = woken(q, lambda: q.get(timeout=LONG), lambda: add(q, grp([0])))
  assert kind == "returned" and [g.index for g in b.groups] == [0]


def test_publish_wakes_a_blocked_admit():
  q = StalenessQueue(eta=0, groups_per_update=1)
  add(q, grp([0]))
  get(q)
  kind, t = woken(q, lambda: q.admit(1, timeout=LONG), lambda: q.publish(1))
  assert kind == "returned" and t == Ticket(1, 1)


@pytest.mark.parametrize("attempts", [1, 2])
def test_retry_wakes_a_blocked_admit(attempts):
  """With one attempt the retry abandons (a slot frees); with two it queues a replay."""
  q = StalenessQueue(eta=0, groups_per_update=1, max_attempts=attempts)
  t = admit(q, 1)
  kind, got = woken(q, lambda: q.admit(1, timeout=LONG), lambda: q.retry(t))
  assert kind == "returned" and got == (Ticket(1, 1) if attempts == 1 else Ticket(0, 1, 1))


def test_a_get_wakes_a_producer_blocked_on_a_full_queue():
  q = StalenessQueue(eta=3, groups_per_update=1, max_queued_groups=1)
  add(q, grp([0]))
  t = admit(q, 1)
  kind, _ = woken(q, lambda: q.put(t, [grp([0])], timeout=LONG), lambda: get(q))
  assert kind == "returned" and q.counts().queued == 1


def test_close_wakes_a_blocked_put_and_keeps_the_first_error():
  q = StalenessQueue(eta=3, groups_per_update=1, max_queued_groups=1)
  add(q, grp([0]))
  t = admit(q, 1)
  first = RuntimeError("boom")
  kind, err = woken(q, lambda: q.put(t, [grp([0])], timeout=LONG), lambda: q.close(first))
  assert kind == "raised" and isinstance(err, QueueClosed)
  assert str(err) == "staleness queue closed: RuntimeError('boom')" and err.__cause__ is first
  q.close(ValueError("later"))  # idempotent: the first error stays
  assert q.closed and q.error is first
  for call in (lambda: admit(q, 1), lambda: get(q), lambda: q.get(timeout=1)):
    with pytest.raises(QueueClosed, match=exact("staleness queue closed: RuntimeError('boom')")):
      call()


def test_close_without_an_error_and_put_after_close():
  q = StalenessQueue(eta=1, groups_per_update=1)
  t = admit(q, 1)
  assert not q.closed and q.error is None
  q.close()
  assert q.closed and q.error is None
  with pytest.raises(QueueClosed, match=exact("staleness queue closed")) as info:
    put(q, t, [grp([0])])  # room in the queue, but closed
  assert info.value.__cause__ is None
  assert q.counts().queued == 0


class _Interrupted(Exception):
  pass


def test_an_interrupt_delivered_to_another_thread_reaches_a_main_thread_blocked_in_get():
  """Ctrl-C goes to any thread of the process; the main thread, blocked in get() without a
  timeout, must still see it (the wait polls, so the handler runs within the poll)."""
  q = StalenessQueue(eta=0, groups_per_update=1)
  stop, done, rescued = threading.Event(), threading.Event(), []
  bystander = threading.Thread(target=stop.wait, daemon=True)  # receives the signal
  bystander.start()

  def deliver():
    wait_until_blocked(q)
    signal.pthread_kill(bystander.ident, signal.SIGINT)
    if not done.wait(GRACE):  # the main thread never saw it: free it and fail below
      rescued.append(True)
      q.close()

  def handler(signum, frame):
    raise _Interrupted()

  old = signal.signal(signal.SIGINT, handler)
  th = threading.Thread(target=deliver, daemon=True)
  th.start()
  try:
    with pytest.raises(_Interrupted):
      q.get()  # no deadline: the polling wait
  finally:
    done.set()
    signal.signal(signal.SIGINT, old)
    stop.set()
    th.join(GRACE)
  assert not rescued, "the interrupt did not reach the blocked main thread"


# --------------------------------------------------------------- accounting
def test_each_broken_relation_is_named():
  q = StalenessQueue(eta=0, groups_per_update=1)
  admit(q, 1)
  q._produced += 1
  with pytest.raises(InvariantError, match=exact("started=1 != produced=1 + in_flight=1 + abandoned=0")):
    q.assert_invariant()

  q = StalenessQueue(eta=0, groups_per_update=1)
  add(q, grp([0]))
  q._consumed += 1
  with pytest.raises(InvariantError, match=exact("produced=1 != consumed=1 + dropped=0 + queued=1")):
    q.assert_invariant()

  q = StalenessQueue(eta=0, groups_per_update=1)
  admit(q, 1)
  q._started += 1
  q._in_flight += 1
  with pytest.raises(InvariantError, match=exact(
      "live groups 2 exceed the admission budget (eta=0 + published=0 + 1) x T=1 = 1")):
    q.assert_invariant()

  q = StalenessQueue(eta=3, groups_per_update=1, max_queued_groups=1)
  add(q, grp([0]))  # queued == max_queued is fine
  q.assert_invariant()
  q._started, q._produced, q._queued = 2, 2, 2
  with pytest.raises(InvariantError, match=exact("queued=2 (deque holds 1), max_queued=1")):
    q.assert_invariant()

  q = StalenessQueue(eta=3, groups_per_update=1, max_queued_groups=2)
  add(q, grp([0]))
  q._ready.append(Group(9, [], {}))
  with pytest.raises(InvariantError, match=exact("queued=1 (deque holds 2), max_queued=2")):
    q.assert_invariant()

  q = StalenessQueue(eta=0, groups_per_update=1)
  admit(q, 1)
  q._out[99] = Ticket(99, 1)
  with pytest.raises(InvariantError, match=exact("in_flight=1 but outstanding tickets hold 2 groups")):
    q.assert_invariant()
