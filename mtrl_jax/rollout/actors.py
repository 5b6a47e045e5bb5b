"""The host-side actor pool: K threads playing groups against the latest weights.

Each actor thread loops: ask the staleness queue for a ticket (a few groups),
play those tasks x G sessions with its own `RolloutEngine`, put the finished
groups in the queue. The learner publishes new weights on a `ParamBoard`
after each update; an actor picks them up between turns, so one session may
span several policy versions and each token keeps the version that made it.

All actors share one `Sampler`'s compiled programs (no per-actor compiles):
each gets a shallow copy whose weights it swaps itself (`ActorSampler`).
Jitted calls release the GIL, so one actor decodes while others wait on their
environments.

Faults:
  * an env that raises ends only its session (the engine records env_error);
    with `step_timeout_s`, a reset or step that takes longer raises
    `EnvTimeout` there too (the stuck call's thread is left to finish alone);
  * an actor that raises anything else (a bug outside env code) dies; its
    ticket goes back to the queue for a replay and the supervisor thread
    starts a fresh actor in its slot, counting the restart; past
    `max_restarts` the pool gives up and closes the queue with the error;
  * `stop()` stops the actors (they check between turns), wakes any that
    wait on the queue, joins every thread with a timeout and returns the names
    of those that did not stop.
"""
from __future__ import annotations

import copy
import dataclasses
import threading
import time
from typing import Any, Callable, NamedTuple

import jax
from absl import logging

from mtrl_jax.envs.base import EnvError
from mtrl_jax.rollout.ownership import HostShare, group_key, group_number, host_share
from mtrl_jax.rollout.staleness_queue import QueueClosed, StalenessQueue, Ticket

THREAD_PREFIX = "mtrl-actor"
TIMED_OUT_THREAD = "mtrl-env-timed-out"


class ActorStopped(Exception):
  """Raised inside an actor's engine once the pool is stopping."""


class EnvTimeout(EnvError):
  """An env reset or step took longer than the pool's `step_timeout_s`."""


class Published(NamedTuple):
  params: Any
  version: int


class ParamBoard:
  """The latest published (params, version), swapped atomically."""

  def __init__(self, params, version: int):
    self._lock = threading.Lock()
    self._latest = Published(params, int(version))

  def publish(self, params, version: int) -> None:
    with self._lock:
      self._latest = Published(params, int(version))

  def read(self) -> Published:
    with self._lock:
      return self._latest

  @property
  def version(self) -> int:
    return self.read().version


class ActorSampler:
  """One actor's sampler: the shared compiled calls, its own weights.

  The engine reads `version` right before each `generate`. Reading it here
  also loads the latest published weights into this actor's copy, so the
  version stamped on a turn is the version of the weights that decode it;
  reading a shared sampler's version and then generating could straddle a
  publish. It also raises `ActorStopped` once the pool stops. `init_state`
  loads the latest weights too, so a batch's first prefill is not done with
  the weights its actor's previous batch ended on.

  Between turns only the weights change: the KV cache of the earlier turns
  keeps the keys and values the older weights computed (AReaL recomputes
  them with the new weights; here that would re-prefill every live history
  on each publish). The recorded behaviour log-probs are those of the
  distribution actually sampled from, which is what decoupled PPO needs.
  """

  def __init__(self, base, board: ParamBoard, stop: threading.Event):
    self._inner = copy.copy(base)  # shares the jitted functions, not the weights
    self._board, self._stop = board, stop
    self._pin()

  def _pin(self) -> int:
    latest = self._board.read()
    if latest.version != self._inner.version or latest.params is not self._inner.params:
      self._inner.set_params(latest.params, latest.version)
    return latest.version

  @property
  def version(self) -> int:
    if self._stop.is_set():
      raise ActorStopped()
    return self._pin()

  def weights(self, latest: bool = True):
    """(params, version) this actor decodes with; `latest` loads the newest published first.

    The continuous engine calls it before each decode call (rollout/continuous.py):
    with partial rollouts (latest=True) a session in flight moves to new weights
    at the next call; without, the run keeps the weights it started with.
    """
    if self._stop.is_set():
      raise ActorStopped()
    if latest:
      self._pin()
    return self._inner.weights()

  def init_state(self, batch: int, capacity: int):
    # A new engine batch: its first prompts are prefilled with the newest
    # weights, not with those its previous batch ended on.
    self._pin()
    return self._inner.init_state(batch, capacity)

  def __getattr__(self, name: str):
    if name == "_inner":  # not yet set (copy, pickle): no recursion
      raise AttributeError(name)
    return getattr(self._inner, name)


class TimeoutEnv:
  """Runs an env's reset / step in a helper thread and gives up after `timeout_s`.

  A call that runs over raises `EnvTimeout` (the engine ends that session as
  an env error). Python cannot kill a thread, so the stuck call keeps running
  in a daemon thread renamed `mtrl-env-timed-out`; the env is never used again.
  """

  def __init__(self, env, timeout_s: float):
    self.env, self.timeout_s = env, float(timeout_s)

  def reset(self, seed: int, session: int | None = None):
    return self._call("reset", seed, session)

  def step(self, action: str):
    return self._call("step", action)

  def __getattr__(self, name: str):
    if name == "env":
      raise AttributeError(name)
    return getattr(self.env, name)

  def _call(self, method: str, *args):
    box: dict[str, Any] = {}

    def run():
      try:
        box["out"] = getattr(self.env, method)(*args)
      except BaseException as e:  # handed to the caller's thread below
        box["err"] = e

    th = threading.Thread(target=run, name="mtrl-env-call", daemon=True)
    th.start()
    th.join(self.timeout_s)
    if th.is_alive():
      th.name = TIMED_OUT_THREAD
      raise EnvTimeout(f"env {method} took longer than step_timeout_s={self.timeout_s:g}")
    if "err" in box:
      raise box["err"]
    return box["out"]


@dataclasses.dataclass
class _Slot:
  """One actor position; its thread is replaced when it crashes."""
  index: int
  thread: threading.Thread | None = None
  generation: int = 0
  ticket: Ticket | None = None
  error: BaseException | None = None
  busy_s: float = 0.0   # playing: generating, prefilling, stepping envs
  wait_s: float = 0.0   # blocked on admission or on a full queue
  phase: str = "wait"
  since: float = 0.0
  chunks: int = 0


class PoolStats(NamedTuple):
  busy_s: float     # summed over actors, since start
  wait_s: float
  chunks: int       # tickets played to the end
  restarts: int
  alive: int        # actor threads alive now


class ActorPool:
  """K actor threads and their supervisor (see the module doc).

  Args:
    engine: a template `RolloutEngine` (group size, budgets, env factory,
      sampling); each actor plays with a shallow copy whose sampler is an
      `ActorSampler` over `engine.sampler`.
    queue: the `StalenessQueue` the actors admit from and put into.
    board: where the learner publishes weights.
    num_actors: K.
    groups_per_chunk: groups one actor asks for per ticket.
    seed: sampling keys derive from it and the group's place: group j of
      batch k samples with `ownership.group_key(key(seed), k, j)` (one key per
      session, see rollout/ownership.py), as `SyncSource` does.
    groups_per_update: T.
    batch_seeds: `fn(k) -> T task seeds` of batch k; group j of batch k
      plays `batch_seeds(k)[j]`. With `train.source.task_seeds`, the
      sessions of update k are those `SyncSource` plays, however the groups
      are split into tickets, and a replayed ticket repeats itself.
    share: this host's block of each batch's T groups (several hosts; default
      all of them). The queue then numbers only this host's groups: its
      local group n is group `share.start + n % share.size` of batch
      `n // share.size`, whose session records carry the global group id
      `k * T + j`.
    step_timeout_s: per reset / step limit of an env (None: no limit).
    max_restarts: actor crashes tolerated before the pool fails.
    fault_hook: test hook `fn(actor_index, ticket)`, called after admission,
      outside env code; an exception there plays an actor crash.
  """

  def __init__(self, engine, queue: StalenessQueue, board: ParamBoard, *, num_actors: int,
               groups_per_chunk: int, seed: int, groups_per_update: int,
               batch_seeds: Callable[[int], list[int]], step_timeout_s: float | None = None,
               max_restarts: int = 20, fault_hook: Callable[[int, Ticket], None] | None = None,
               poll_s: float = 0.02, share: HostShare | None = None):
    if num_actors < 1:
      raise ValueError(f"ActorPool.num_actors must be >= 1, got {num_actors}")
    if groups_per_chunk < 1:
      raise ValueError(f"ActorPool.groups_per_chunk must be >= 1, got {groups_per_chunk}")
    if step_timeout_s is not None and step_timeout_s <= 0:
      raise ValueError(f"ActorPool.step_timeout_s must be positive or None, got {step_timeout_s}")
    self.engine, self.queue, self.board = engine, queue, board
    self.groups_per_chunk, self.groups_per_update = int(groups_per_chunk), int(groups_per_update)
    self.share = share or host_share(self.groups_per_update, 0, 1)
    if self.share.tasks != self.groups_per_update:
      raise ValueError(f"ActorPool: share covers {self.share.tasks} groups per batch, "
                       f"groups_per_update is {self.groups_per_update}")
    self.seed, self.step_timeout_s, self.batch_seeds = int(seed), step_timeout_s, batch_seeds
    self.max_restarts, self.fault_hook, self.poll_s = int(max_restarts), fault_hook, poll_s
    self.key = jax.random.key(self.seed)
    self.slots = [_Slot(i) for i in range(num_actors)]
    self.restarts = 0
    self.crashes: list[str] = []  # repr of each actor crash, in order
    self.error: BaseException | None = None  # set when the pool gave up
    self._stop = threading.Event()
    self._lock = threading.Lock()
    self._supervisor: threading.Thread | None = None
    self._seed_cache: dict[int, list[int]] = {}

  # ------------------------------------------------------------- lifecycle
  def start(self) -> None:
    if self._supervisor is not None:
      raise RuntimeError("ActorPool.start: already started")
    # Build one env on this thread first: a bad env config fails here, loudly,
    # and lazily-loaded registries are filled before the actor threads race.
    self.engine.env_factory()
    for slot in self.slots:
      self._launch(slot)
    self._supervisor = threading.Thread(target=self._supervise, name=f"{THREAD_PREFIX}-supervisor", daemon=True)
    self._supervisor.start()

  def stop(self, timeout_s: float = 10.0) -> list[str]:
    """Stops and joins every pool thread; returns the names of those still alive."""
    self._stop.set()
    self.queue.close(self.error)
    deadline = time.monotonic() + timeout_s
    threads = ([self._supervisor] if self._supervisor else []) + [s.thread for s in self.slots if s.thread]
    for th in threads:
      th.join(max(deadline - time.monotonic(), 0.0))
    alive = [th.name for th in threads if th.is_alive()]
    stuck_envs = sum(th.name == TIMED_OUT_THREAD and th.is_alive() for th in threading.enumerate())
    if alive:
      logging.warning("actor pool: %d thread(s) did not stop within %.1fs: %s", len(alive), timeout_s, alive)
    if stuck_envs:
      logging.warning("actor pool: %d timed-out env call(s) are still running (daemon threads)", stuck_envs)
    return alive

  def stats(self) -> PoolStats:
    now = time.perf_counter()
    busy = wait = 0.0
    chunks = alive = 0
    with self._lock:
      for s in self.slots:
        running = now - s.since if s.thread is not None and s.thread.is_alive() else 0.0
        busy += s.busy_s + (running if s.phase == "busy" else 0.0)
        wait += s.wait_s + (running if s.phase == "wait" else 0.0)
        chunks += s.chunks
        alive += int(s.thread is not None and s.thread.is_alive())
      return PoolStats(busy, wait, chunks, self.restarts, alive)

  # ---------------------------------------------------------------- actors
  def _launch(self, slot: _Slot) -> None:
    engine = copy.copy(self.engine)
    engine.sampler = ActorSampler(self.engine.sampler, self.board, self._stop)
    if self.step_timeout_s is not None:
      make, limit = self.engine.env_factory, self.step_timeout_s
      engine.env_factory = lambda: TimeoutEnv(make(), limit)
    slot.generation += 1
    slot.error, slot.ticket = None, None
    with self._lock:
      slot.phase, slot.since = "wait", time.perf_counter()
    slot.thread = threading.Thread(target=self._actor, args=(slot, engine), daemon=True,
                                   name=f"{THREAD_PREFIX}-{slot.index}.{slot.generation}")
    slot.thread.start()

  def _enter(self, slot: _Slot, phase: str) -> None:
    now = time.perf_counter()
    with self._lock:
      if slot.phase == "busy":
        slot.busy_s += now - slot.since
      else:
        slot.wait_s += now - slot.since
      slot.phase, slot.since = phase, now

  def _place(self, n: int) -> tuple[int, int]:
    """(batch k, index j among the batch's T groups) of this host's local group n."""
    k, local = divmod(n, self.share.size)
    return k, self.share.global_index(local)

  def _group_seed(self, n: int) -> int:
    k, j = self._place(n)
    if k not in self._seed_cache:  # benign race: both threads compute the same list
      self._seed_cache[k] = [int(x) for x in self.batch_seeds(k)]
    return self._seed_cache[k][j]

  def _group_id(self, n: int) -> int:
    return group_number(*self._place(n), self.groups_per_update)

  def _group_key(self, n: int) -> jax.Array:
    return group_key(self.key, *self._place(n))

  def _actor(self, slot: _Slot, engine) -> None:
    try:
      while not self._stop.is_set():
        self._enter(slot, "wait")
        ticket = self.queue.admit(self.groups_per_chunk)
        slot.ticket = ticket
        self._enter(slot, "busy")
        if self.fault_hook is not None:
          self.fault_hook(slot.index, ticket)
        # Global group ids (unique across actors and hosts): the learner groups sessions by them.
        gids = [self._group_id(n) for n in ticket.groups]
        res = engine.run([self._group_seed(n) for n in ticket.groups],
                         group_keys=[self._group_key(n) for n in ticket.groups], group_ids=gids)
        self._enter(slot, "wait")
        share = 1.0 / ticket.num_groups
        meta = {"generate_s": res.timing.generate_s * share, "prefill_s": res.timing.prefill_s * share,
                "env_s": res.timing.env_s * share, "rollout_s": res.timing.total_s * share,
                "prefill_saved": res.ledger.prefill_saved_total * share,
                "decode_row_steps": res.ledger.decode_row_steps * share, "actor": slot.index}
        # By group id, not by position: a tree engine leaves out the unborn
        # siblings of a session that ended before a branch turn.
        by_group = {gid: [] for gid in gids}
        for sess in res.sessions:
          by_group[sess.group_id].append(sess)
        groups = list(by_group.values())
        self.queue.put(ticket, groups, [meta] * ticket.num_groups)
        slot.ticket = None
        with self._lock:
          slot.chunks += 1
    except (QueueClosed, ActorStopped):
      pass
    except BaseException as e:  # a crash outside env code: replay the ticket, let the supervisor restart
      slot.error = e
      logging.warning("actor %s crashed: %r", threading.current_thread().name, e)
      if slot.ticket is not None and not self.queue.closed:
        try:
          if not self.queue.retry(slot.ticket):
            logging.warning("actor pool: ticket %s abandoned after repeated crashes", slot.ticket)
        except (ValueError, QueueClosed):
          pass
    finally:
      self._enter(slot, "wait")

  def _supervise(self) -> None:
    while not self._stop.wait(self.poll_s):
      for slot in self.slots:
        th = slot.thread
        if th is None or th.is_alive() or slot.error is None or self._stop.is_set():
          continue
        with self._lock:
          self.restarts += 1
        self.crashes.append(repr(slot.error))
        if self.restarts > self.max_restarts:
          err = RuntimeError(f"actor pool: {self.restarts} actor crashes exceed max_restarts="
                             f"{self.max_restarts}; last: {slot.error!r}")
          err.__cause__ = slot.error
          self.error = err
          self.queue.close(err)
          return
        self._launch(slot)
