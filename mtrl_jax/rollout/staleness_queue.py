"""The staleness-aware queue between the actor threads and the learner.

AReaL's admission control (Fu et al., 2025, "AReaL: a large-scale
asynchronous reinforcement learning system") with bound `eta`, in whole
groups: the G sessions played from one task are admitted, played, queued and
consumed together, because a group-relative baseline (GRPO and kin) computed
on part of a group is a different estimator. T = groups per update
(tasks_per_update), so one update trains B = T x G sessions.

Admission. `admit(n)` hands an actor a `Ticket` for up to n new groups and
blocks while

    live + 1 > (eta + P + 1) * T,     live = started - dropped - abandoned,

where P is the number of updates whose weights the learner has published
(`publish`). A ticket near the bound gets fewer groups than asked, so any
chunk size works. Dropped and abandoned groups give their slot back: were they
counted, a run with drops would soon need more groups than the bound lets
start and the learner would wait forever. Without drops this is AReaL's rule:
once P updates are published, at most (eta + P + 1) * T groups were started.
P counts published updates rather than policy versions so that updates that
leave the policy unchanged (critic warm-up) still open admission.

Staleness. When the learner at policy version V takes a batch, a group whose
oldest generated token came from version v has staleness V - v. A group with
any session over `eta` is dropped whole (its fresher sessions too: keeping
them would silently change their group baseline); dropped groups are counted
and never returned.

eta = 0 is the synchronous trainer: only T groups may be live, so the actors
start batch P + 1 only after the learner took batch P and published.

Memory. At most `max_queued_groups` finished groups wait; `put` blocks above
it. `get` drops stale groups as it waits, which frees room.

Accounting, checked on every call (`InvariantError` if broken), in groups:
    started  == produced + in_flight + abandoned
    produced == consumed + dropped + queued
    started - dropped - abandoned <= (eta + P + 1) * T
    queued <= max_queued_groups
A ticket whose actor died goes back (`retry`) and stays in flight until an
actor replays it; after `max_attempts` it is abandoned (the only way a
started group is never produced while the queue is open).
"""
from __future__ import annotations

import collections
import threading
import time
from typing import NamedTuple, Sequence

import numpy as np

from mtrl_jax.rollout.session import Session

# A wait without a deadline wakes this often (seconds), so a Ctrl-C delivered
# to another thread still reaches a main thread blocked in the queue: the
# signal handler only runs once the main thread is back in Python code.
_POLL_S = 0.1


class QueueClosed(RuntimeError):
  """The queue was closed; every waiting producer and consumer gets this."""


class InvariantError(AssertionError):
  """The queue's counters disagree: a bug, never a user error."""


class Ticket(NamedTuple):
  """Permission to play groups first_group .. first_group + num_groups - 1."""
  first_group: int
  num_groups: int
  attempt: int = 0  # 0 on first hand-out, +1 per replay after an actor died

  @property
  def groups(self) -> range:
    return range(self.first_group, self.first_group + self.num_groups)


class Group(NamedTuple):
  """One finished group: G sessions from one task, and what its actor noted."""
  index: int
  sessions: list
  meta: dict


class Batch(NamedTuple):
  """What the learner gets: T groups, their staleness, and what was dropped on the way."""
  groups: list              # [T] Group, in completion order
  staleness_b: np.ndarray   # int [sessions]: V - oldest version of each returned session (0 if it has none)
  version: int              # the learner version V the staleness is measured against
  dropped_groups: int       # stale groups discarded while gathering this batch
  dropped_sessions: int
  waited_s: float           # seconds `get` blocked

  @property
  def sessions(self) -> list:
    return [s for g in self.groups for s in g.sessions]


class Counts(NamedTuple):
  """A consistent snapshot of the counters (groups)."""
  started: int
  in_flight: int
  produced: int
  consumed: int
  dropped: int
  queued: int
  abandoned: int
  published: int       # P: updates whose weights were published
  batches_taken: int
  version: int         # last published policy version
  budget: int          # (eta + P + 1) * T
  dropped_sessions: int


def group_min_version(sessions: Sequence[Session]) -> int | None:
  """Oldest policy version among a group's generated tokens (None if it generated none)."""
  versions = [v for v in (s.min_version() for s in sessions) if v is not None]
  return min(versions) if versions else None


class StalenessQueue:
  """Admission, bounded FIFO and staleness filter (see the module doc).

  Args:
    eta: the staleness bound (>= 0); 0 is synchronous training.
    groups_per_update: T, groups the learner takes per update.
    max_queued_groups: finished groups that may wait; at least T plus the
      largest chunk minus one (so a blocked producer always means the learner
      can take a batch). Default: (eta + 1) * T, which admission alone never
      exceeds, raised to that minimum.
    max_chunk: the most groups one `admit` may ask for.
    max_attempts: hand-outs of one ticket before it is abandoned.
    first_group: index of the first group (a resumed run continues its seeds).
    version: the policy version the actors start with.
  """

  def __init__(self, *, eta: int, groups_per_update: int, max_queued_groups: int | None = None,
               max_chunk: int = 1, max_attempts: int = 3, first_group: int = 0, version: int = 0):
    if int(eta) != eta or eta < 0:
      raise ValueError(f"StalenessQueue.eta must be an integer >= 0, got {eta!r}")
    if groups_per_update < 1:
      raise ValueError(f"StalenessQueue.groups_per_update must be >= 1, got {groups_per_update}")
    if not 1 <= max_chunk <= groups_per_update:
      raise ValueError(f"StalenessQueue.max_chunk must be in [1, groups_per_update={groups_per_update}], "
                       f"got {max_chunk}")
    floor = groups_per_update + max_chunk - 1
    if max_queued_groups is None:
      max_queued_groups = max((int(eta) + 1) * groups_per_update, floor)
    if max_queued_groups < floor:
      raise ValueError(f"StalenessQueue.max_queued_groups={max_queued_groups} must be >= groups_per_update + "
                       f"max_chunk - 1 = {floor}, or producers could block while the learner waits")
    if max_attempts < 1:
      raise ValueError(f"StalenessQueue.max_attempts must be >= 1, got {max_attempts}")
    self.eta, self.groups_per_update = int(eta), int(groups_per_update)
    self.max_queued, self.max_chunk, self.max_attempts = int(max_queued_groups), int(max_chunk), int(max_attempts)
    self._cv = threading.Condition()
    self._ready: collections.deque[Group] = collections.deque()
    self._retry: collections.deque[Ticket] = collections.deque()
    self._out: dict[int, Ticket] = {}  # tickets held by actors (or waiting for a replay), by first_group
    self._next_group = int(first_group)
    self._started = self._in_flight = self._produced = self._consumed = 0
    self._dropped = self._queued = self._abandoned = self._dropped_sessions = 0
    self._published = self._batches = 0
    self._version = int(version)
    self._closed = False
    self._error: BaseException | None = None

  # ------------------------------------------------------------ bookkeeping
  def _budget(self) -> int:
    return (self.eta + self._published + 1) * self.groups_per_update

  def _live(self) -> int:
    return self._started - self._dropped - self._abandoned

  def counts(self) -> Counts:
    with self._cv:
      return self._counts()

  def _counts(self) -> Counts:
    return Counts(self._started, self._in_flight, self._produced, self._consumed, self._dropped, self._queued,
                  self._abandoned, self._published, self._batches, self._version, self._budget(),
                  self._dropped_sessions)

  def assert_invariant(self) -> None:
    """Raises InvariantError naming the broken relation."""
    with self._cv:
      self._check()

  def _check(self) -> None:
    c = self._counts()
    if c.started != c.produced + c.in_flight + c.abandoned:
      raise InvariantError(f"started={c.started} != produced={c.produced} + in_flight={c.in_flight} "
                           f"+ abandoned={c.abandoned}")
    if c.produced != c.consumed + c.dropped + c.queued:
      raise InvariantError(f"produced={c.produced} != consumed={c.consumed} + dropped={c.dropped} "
                           f"+ queued={c.queued}")
    if c.started - c.dropped - c.abandoned > c.budget:
      raise InvariantError(f"live groups {c.started - c.dropped - c.abandoned} exceed the admission budget "
                           f"(eta={self.eta} + published={c.published} + 1) x T={self.groups_per_update} = {c.budget}")
    if c.queued > self.max_queued or c.queued != len(self._ready):
      raise InvariantError(f"queued={c.queued} (deque holds {len(self._ready)}), max_queued={self.max_queued}")
    held = sum(t.num_groups for t in self._out.values())
    if held != c.in_flight:
      raise InvariantError(f"in_flight={c.in_flight} but outstanding tickets hold {held} groups")

  def _raise_if_closed(self) -> None:
    if self._closed:
      raise QueueClosed("staleness queue closed" + (f": {self._error!r}" if self._error else "")) from self._error

  def _wait(self, deadline: float | None, what: str) -> None:
    if deadline is None:
      self._cv.wait(_POLL_S)
      return
    left = deadline - time.monotonic()
    if left <= 0:
      raise TimeoutError(f"StalenessQueue.{what}: timed out")
    self._cv.wait(left)

  @staticmethod
  def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout

  # -------------------------------------------------------------- producers
  def admit(self, n: int, timeout: float | None = None) -> Ticket:
    """Blocks until at least one group may start; returns a ticket for up to n groups.

    A ticket given back by a dead actor (`retry`) is handed out first.
    """
    if not 1 <= n <= self.max_chunk:
      raise ValueError(f"admit: n must be in [1, max_chunk={self.max_chunk}], got {n}")
    deadline = self._deadline(timeout)
    with self._cv:
      while True:
        self._raise_if_closed()
        if self._retry:
          t = self._retry.popleft()
          t = t._replace(attempt=t.attempt + 1)
          self._out[t.first_group] = t
          self._check()
          return t
        free = self._budget() - self._live()
        if free >= 1:
          t = Ticket(self._next_group, min(n, free))
          self._next_group += t.num_groups
          self._started += t.num_groups
          self._in_flight += t.num_groups
          self._out[t.first_group] = t
          self._check()
          return t
        self._wait(deadline, "admit")

  def put(self, ticket: Ticket, groups: Sequence[Sequence[Session]], metas: Sequence[dict] | None = None,
          timeout: float | None = None) -> None:
    """Queues a ticket's finished groups (in ticket order); blocks while the queue is full."""
    if len(groups) != ticket.num_groups:
      raise ValueError(f"put: ticket {ticket.first_group} covers {ticket.num_groups} groups, got {len(groups)}")
    metas = list(metas) if metas is not None else [{} for _ in groups]
    if len(metas) != len(groups):
      raise ValueError(f"put: {len(metas)} metas for {len(groups)} groups")
    deadline = self._deadline(timeout)
    with self._cv:
      if self._out.get(ticket.first_group) != ticket:
        raise ValueError(f"put: ticket {ticket} is not in flight (already put, retried or never admitted)")
      while self._queued + ticket.num_groups > self.max_queued:
        self._raise_if_closed()
        self._wait(deadline, "put")
      self._raise_if_closed()
      del self._out[ticket.first_group]
      k = ticket.num_groups
      self._in_flight -= k
      self._produced += k
      self._queued += k
      for i, (g, m) in enumerate(zip(groups, metas)):
        self._ready.append(Group(ticket.first_group + i, list(g), dict(m)))
      self._check()
      self._cv.notify_all()

  def retry(self, ticket: Ticket) -> bool:
    """An actor died holding `ticket`: queue it for a replay (True) or abandon it (False)."""
    with self._cv:
      if self._out.get(ticket.first_group) != ticket:
        raise ValueError(f"retry: ticket {ticket} is not in flight")
      if ticket.attempt + 1 >= self.max_attempts:
        del self._out[ticket.first_group]
        self._in_flight -= ticket.num_groups
        self._abandoned += ticket.num_groups
        self._check()
        self._cv.notify_all()
        return False
      # A ticket waiting for its replay is still in flight: it stays in `_out`.
      self._retry.append(ticket)
      self._check()
      self._cv.notify_all()
      return True

  # ---------------------------------------------------------------- learner
  def get(self, n: int | None = None, version: int | None = None, timeout: float | None = None) -> Batch:
    """Blocks until n fresh groups are queued (default T); drops stale ones meanwhile.

    `version` is the learner's policy version V (default: the last published
    one). Groups come out in completion order.
    """
    n = self.groups_per_update if n is None else n
    if not 1 <= n <= self.max_queued:
      raise ValueError(f"get: n must be in [1, max_queued_groups={self.max_queued}], got {n}")
    t0 = time.perf_counter()
    deadline = self._deadline(timeout)
    dropped_g = dropped_s = 0
    with self._cv:
      v_now = self._version if version is None else int(version)
      while True:
        self._raise_if_closed()
        g, s = self._drop_stale(v_now)
        dropped_g, dropped_s = dropped_g + g, dropped_s + s
        if len(self._ready) >= n:
          break
        self._wait(deadline, "get")
      groups = [self._ready.popleft() for _ in range(n)]
      self._queued -= n
      self._consumed += n
      self._batches += 1
      self._check()
      self._cv.notify_all()
    oldest = [s.min_version() for g in groups for s in g.sessions]
    staleness_b = np.asarray([0 if v is None else v_now - v for v in oldest], np.int64)
    return Batch(groups, staleness_b, v_now, dropped_g, dropped_s, time.perf_counter() - t0)

  def _drop_stale(self, version: int) -> tuple[int, int]:
    keep, groups, sessions = collections.deque(), 0, 0
    for g in self._ready:
      v = group_min_version(g.sessions)
      if v is not None and version - v > self.eta:
        groups += 1
        sessions += len(g.sessions)
      else:
        keep.append(g)
    if groups:
      self._ready = keep
      self._queued -= groups
      self._dropped += groups
      self._dropped_sessions += sessions
      self._check()
      self._cv.notify_all()  # room in the queue and admission slots freed
    return groups, sessions

  def publish(self, version: int) -> None:
    """The weights after every batch taken so far are live on the actors (policy `version`).

    Opens admission for the next batch: P becomes the number of batches taken.
    """
    with self._cv:
      if int(version) < self._version:
        raise ValueError(f"publish: version {version} is older than the published {self._version}")
      self._version = int(version)
      self._published = self._batches
      self._check()
      self._cv.notify_all()

  @property
  def unpublished_batches(self) -> int:
    """Batches taken since the last `publish` (a learner must publish before asking again)."""
    with self._cv:
      return self._batches - self._published

  def close(self, error: BaseException | None = None) -> None:
    """Wakes every waiter with QueueClosed (carrying `error`, if given); idempotent."""
    with self._cv:
      if not self._closed:
        self._closed, self._error = True, error
      self._cv.notify_all()

  @property
  def closed(self) -> bool:
    return self._closed

  @property
  def error(self) -> BaseException | None:
    return self._error
