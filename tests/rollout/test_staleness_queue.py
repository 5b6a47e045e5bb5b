"""The staleness queue alone: fake producers and a fake learner, random timing, no model."""
import random
import threading
import time

import numpy as np
import pytest

from mtrl_jax.rollout.session import Session, make_turn
from mtrl_jax.rollout.staleness_queue import InvariantError, QueueClosed, StalenessQueue


def fake_session(sid: int, group: int, versions) -> Session:
  s = Session(session_id=sid, task_id=group, group_id=group, seed=group, env_name="fake")
  for v in versions:
    s.turns.append(make_turn("o", [3, 9], "a", [9, 2], [-1.0, -0.5], v, 0.0))
  s.finish("terminated")
  return s


def fake_group(group: int, versions_per_session) -> list:
  return [fake_session(group * 10 + i, group, vs) for i, vs in enumerate(versions_per_session)]


class World:
  """The actors' view of the weights: the version the learner last published."""

  def __init__(self):
    self.version = 0
    self.lock = threading.Lock()

  def read(self):
    with self.lock:
      return self.version


def run_fuzz(seed: int):
  r = random.Random(seed)
  eta, T = r.choice([0, 0, 1, 2, 3]), r.randint(1, 4)
  chunk, G = r.randint(1, T), r.randint(1, 3)
  n_producers, updates = r.randint(1, 5), r.randint(4, 8)
  max_q = r.choice([None, T + chunk - 1])
  q = StalenessQueue(eta=eta, groups_per_update=T, max_queued_groups=max_q, max_chunk=chunk)
  world, done, problems = World(), threading.Event(), []

  def producer(i):
    pr = random.Random(seed * 1000 + i)
    try:
      while True:
        t = q.admit(chunk)
        groups = []
        for g in t.groups:
          sessions = []
          for s in range(G):
            versions = []
            for _ in range(pr.randint(1, 3)):  # a version read per turn, as the engine does
              versions.append(world.read())
              # Heavy-tailed turns: some sessions outlive several updates.
              time.sleep(pr.uniform(0, 0.003) if pr.random() > 0.1 else pr.uniform(0.01, 0.04))
            sessions.append(versions)
          groups.append(fake_group(g, sessions))
        q.put(t, groups)
    except QueueClosed:
      return

  def monitor():
    while not done.is_set():
      c = q.counts()
      if c.started - c.dropped - c.abandoned > (eta + c.published + 1) * T:
        problems.append(("admission", c))
      if c.started != c.produced + c.in_flight + c.abandoned or c.produced != c.consumed + c.dropped + c.queued:
        problems.append(("accounting", c))
      if c.queued > q.max_queued:
        problems.append(("memory", c))
      time.sleep(0.0005)

  threads = [threading.Thread(target=producer, args=(i,)) for i in range(n_producers)]
  threads.append(threading.Thread(target=monitor))
  for th in threads:
    th.start()
  seen_groups, staleness = set(), []
  try:
    for u in range(updates):
      b = q.get()
      v_learner = world.read()
      assert b.version == v_learner and len(b.groups) == T
      for g in b.groups:
        assert g.index not in seen_groups
        seen_groups.add(g.index)
        assert len(g.sessions) == G
        for s in g.sessions:
          st = v_learner - min(int(t.version.min()) for t in s.turns)
          assert st <= eta, (st, eta)
          staleness.append(st)
      np.testing.assert_array_equal(np.sort(b.staleness_b), np.sort(staleness[-len(b.sessions):]))
      time.sleep(r.uniform(0, 0.01))  # the update
      with world.lock:
        world.version += 1
      q.publish(world.version)
  finally:
    q.close()
    done.set()
    for th in threads:
      th.join(5)
  assert not [th for th in threads if th.is_alive()]
  assert not problems, problems[:3]
  q.assert_invariant()
  c = q.counts()
  assert c.consumed == updates * T and c.batches_taken == updates
  if eta == 0:  # synchronous: nothing is ever stale
    assert c.dropped == 0 and set(staleness) == {0}
  return c


@pytest.mark.parametrize("seed", range(8))
def test_bound_and_accounting_hold_under_random_timing(seed):
  run_fuzz(seed)


def test_eta0_starts_the_next_batch_only_after_publish():
  q = StalenessQueue(eta=0, groups_per_update=2)
  t1, t2 = q.admit(1), q.admit(1)
  with pytest.raises(TimeoutError):
    q.admit(1, timeout=0.05)
  q.put(t1, [fake_group(t1.first_group, [[0]])])
  q.put(t2, [fake_group(t2.first_group, [[0]])])
  q.get()
  with pytest.raises(TimeoutError):  # taken, but not yet published
    q.admit(1, timeout=0.05)
  q.publish(1)
  assert q.admit(1).first_group == 2


def test_partial_ticket_at_the_bound_keeps_whole_batches_reachable():
  # Chunks of 3 with T = 4 and eta = 0: the second ticket gets only 1 group.
  q = StalenessQueue(eta=0, groups_per_update=4, max_chunk=3)
  a, b = q.admit(3), q.admit(3)
  assert (a.num_groups, b.num_groups) == (3, 1)
  q.put(a, [fake_group(g, [[0]]) for g in a.groups])
  q.put(b, [fake_group(g, [[0]]) for g in b.groups])
  assert [g.index for g in q.get().groups] == [0, 1, 2, 3]


def test_a_group_with_one_stale_session_is_dropped_whole_and_counted():
  q = StalenessQueue(eta=1, groups_per_update=1)
  t0 = q.admit(1)
  q.put(t0, [fake_group(0, [[0, 2], [2]])])  # session 0 started at version 0
  t1 = q.admit(1)
  q.put(t1, [fake_group(1, [[2], [1, 2]])])
  q.publish(2)  # as if two updates were published (P stays 0: no batch taken yet)
  b = q.get(version=2)
  assert [g.index for g in b.groups] == [1]
  assert (b.dropped_groups, b.dropped_sessions) == (1, 2)
  assert b.staleness_b.tolist() == [0, 1]
  c = q.counts()
  assert (c.dropped, c.dropped_sessions, c.consumed, c.queued) == (1, 2, 1, 0)
  q.assert_invariant()


def test_dropped_groups_give_their_admission_slot_back():
  q = StalenessQueue(eta=0, groups_per_update=1)
  t = q.admit(1)
  q.put(t, [fake_group(0, [[0]])])
  with pytest.raises(TimeoutError):
    q.admit(1, timeout=0.02)
  with pytest.raises(TimeoutError):  # version 1 makes group 0 stale: dropped while waiting
    q.get(version=1, timeout=0.02)
  assert q.counts().dropped == 1
  assert q.admit(1, timeout=0.5).first_group == 1


def test_full_queue_blocks_producers_until_the_learner_takes():
  q = StalenessQueue(eta=3, groups_per_update=1, max_queued_groups=1)
  a = q.admit(1)
  b = q.admit(1)
  q.put(a, [fake_group(0, [[0]])])
  with pytest.raises(TimeoutError):
    q.put(b, [fake_group(1, [[0]])], timeout=0.05)
  assert q.counts().in_flight == 1  # still the actor's until it is queued
  q.get()
  q.put(b, [fake_group(1, [[0]])], timeout=0.5)
  assert q.counts().queued == 1


def test_close_wakes_every_waiter():
  q = StalenessQueue(eta=0, groups_per_update=1, max_queued_groups=1)
  a = q.admit(1)
  q.put(a, [fake_group(0, [[0]])])
  q.get()
  q.publish(1)
  b = q.admit(1)
  q.put(b, [fake_group(1, [[1]])])
  q.get()  # now the learner waits on an empty queue and admission is full
  outcomes = []

  def call(fn):
    try:
      fn()
      outcomes.append("returned")
    except QueueClosed:
      outcomes.append("closed")

  blocked = [threading.Thread(target=call, args=(lambda: q.admit(1),)),       # over the budget
             threading.Thread(target=call, args=(q.get,))]
  for th in blocked:
    th.start()
  time.sleep(0.05)
  q.close()
  for th in blocked:
    th.join(2)
  assert not any(th.is_alive() for th in blocked)
  assert outcomes.count("closed") == 2
  with pytest.raises(QueueClosed):
    q.admit(1)


def test_retry_replays_a_ticket_then_abandons_it():
  q = StalenessQueue(eta=0, groups_per_update=2, max_chunk=2, max_attempts=2)
  t = q.admit(2)
  assert q.retry(t)
  again = q.admit(2)
  assert (again.first_group, again.num_groups, again.attempt) == (0, 2, 1)
  assert q.counts().in_flight == 2
  assert not q.retry(again)  # second crash: abandoned, its slots freed
  c = q.counts()
  assert (c.in_flight, c.abandoned) == (0, 2)
  assert q.admit(2).first_group == 2
  q.assert_invariant()


def test_misuse_is_rejected_with_the_field_named():
  with pytest.raises(ValueError, match="max_queued_groups"):
    StalenessQueue(eta=1, groups_per_update=4, max_chunk=2, max_queued_groups=4)
  with pytest.raises(ValueError, match="eta"):
    StalenessQueue(eta=-1, groups_per_update=1)
  q = StalenessQueue(eta=0, groups_per_update=1)
  t = q.admit(1)
  with pytest.raises(ValueError, match="covers 1 groups"):
    q.put(t, [])
  q.put(t, [fake_group(0, [[0]])])
  with pytest.raises(ValueError, match="not in flight"):
    q.put(t, [fake_group(0, [[0]])])


def test_a_broken_counter_is_caught():
  q = StalenessQueue(eta=0, groups_per_update=1)
  q.admit(1)
  q._produced += 1  # simulate a bookkeeping bug
  with pytest.raises(InvariantError, match="started"):
    q.assert_invariant()
