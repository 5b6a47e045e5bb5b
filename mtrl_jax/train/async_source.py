"""Sessions from an actor pool through a staleness-aware queue (asynchronous RL).

`AsyncSource` implements the `SessionSource` call of `train/source.py`, so the
RL loop stays the same; the one addition is `publish`, which the loop calls
after each update so the actors move to the new weights:

    source = AsyncSource(engine, params=learner.policy_params_for_sampler(),
                         version=learner.version, seed=c.seed, tasks_per_update=T,
                         eta=1, actors=4)
    try:
      for step in range(steps):
        source.publish(learner.policy_params_for_sampler(), learner.version)
        sessions, info = source.next_batch(step)
        learner.update(sessions, step)
    finally:
      source.close()

The learner's update step donates its parameter buffers, so `publish` copies
the parameters before handing them to the actors.

Decoupled PPO needs nothing more here: each token carries its behaviour
log-prob and version (the session records), and `Learner.update` scores the
proximal log-probs with its current weights before the epochs.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from mtrl_jax.rollout.actors import ActorPool, ParamBoard
from mtrl_jax.rollout.ledger import TokenLedger
from mtrl_jax.rollout.ownership import HostShare, host_share
from mtrl_jax.rollout.session import Session
from mtrl_jax.rollout.staleness_queue import QueueClosed, StalenessQueue
from mtrl_jax.train.interrupt import InterruptLatch
from mtrl_jax.train.source import task_seeds


def copy_params(params):
  """A copy the learner's donated step cannot invalidate (materialised before return)."""
  return jax.block_until_ready(jax.tree.map(jnp.copy, params))


class ActorPoolError(RuntimeError):
  """The actor pool failed (too many actor crashes); the cause is chained."""


class AsyncSource:
  """K actor threads feed the learner through a `StalenessQueue` (see module doc).

  Args:
    engine: a template `RolloutEngine`; its sampler's compiled programs are
      shared by the actors, its weights are not touched (`evaluate` may keep
      using it).
    params, version: the weights the actors start with (copied).
    seed: task seeds follow `task_seeds(seed, k, T)` for batch k, as in
      `SyncSource`; groups are numbered from `start_step * T`.
    tasks_per_update: T groups per update (B = T x group size sessions).
    eta: staleness bound (0 = synchronous).
    actors: K actor threads.
    groups_per_chunk: groups one actor plays at a time (one engine batch).
    max_queued_groups: finished groups that may wait (None: see
      `StalenessQueue`).
    start_step: first update of this source (a resumed run).
    step_timeout_s: per env reset / step limit (None: none).
    max_restarts, max_attempts: actor crashes tolerated; replays of one
      ticket before it is abandoned.
    join_timeout_s: how long `close` waits for the threads.
    fault_hook: test hook, see `ActorPool`.
    share: this host's block of each update's groups (several hosts; see
      rollout/ownership.py): the actors play only those, `next_batch` returns
      only those, and admission follows the (global) version the learner
      publishes, the same on every host.
  """

  def __init__(self, engine, *, params, version: int, seed: int, tasks_per_update: int, eta: int,
               actors: int, groups_per_chunk: int = 1, max_queued_groups: int | None = None,
               start_step: int = 0, step_timeout_s: float | None = None, max_restarts: int = 20,
               max_attempts: int = 3, join_timeout_s: float = 10.0, fault_hook=None,
               share: HostShare | None = None):
    if not 1 <= groups_per_chunk <= tasks_per_update:
      raise ValueError(f"AsyncSource.groups_per_chunk must be in [1, tasks_per_update={tasks_per_update}], "
                       f"got {groups_per_chunk}")
    self.tasks, self.eta, self.join_timeout_s = int(tasks_per_update), int(eta), join_timeout_s
    share = share or host_share(self.tasks, 0, 1)
    local = share.size  # the queue counts this host's groups only
    groups_per_chunk = min(groups_per_chunk, local)
    self.queue = StalenessQueue(eta=eta, groups_per_update=local, max_queued_groups=max_queued_groups,
                                max_chunk=groups_per_chunk, max_attempts=max_attempts,
                                first_group=start_step * local, version=version)
    self.board = ParamBoard(copy_params(params), version)
    self.pool = ActorPool(engine, self.queue, self.board, num_actors=actors, groups_per_chunk=groups_per_chunk,
                          seed=seed, groups_per_update=tasks_per_update,
                          batch_seeds=lambda k: task_seeds(seed, k, tasks_per_update),
                          step_timeout_s=step_timeout_s, max_restarts=max_restarts, fault_hook=fault_hook,
                          share=share)
    self._closed = False
    self._last_stats = self.pool.stats()
    # Ctrl-C closes the queue (the actors stop, waiters wake) and is re-raised
    # by every later call even if a library swallowed the first
    # KeyboardInterrupt (train/interrupt.py).
    self.ctrl_c = InterruptLatch(on_interrupt=lambda: self.queue.close(KeyboardInterrupt()))
    self.pool.start()

  # ------------------------------------------------------------------ learner
  def publish(self, params, version: int) -> None:
    """New weights for the actors (copied: the learner donates its own buffers).

    Call it after every update, before the next `next_batch`: it also opens
    admission for the next batch (with eta = 0, nothing is played until then).
    """
    self.ctrl_c.check()
    self.board.publish(copy_params(params), version)
    self.queue.publish(version)

  def next_batch(self, step: int) -> tuple[list[Session], dict]:
    """T fresh groups (staleness <= eta against the published version) and their metrics.

    Sessions come sorted by (group_id, session_id), whatever order the actors
    finished in.

    `step` is not used to pick tasks: they follow the group numbering, so a
    source started at `start_step` with one actor playing whole batches and
    eta = 0 gives update `step` the sessions `SyncSource` would.
    """
    del step
    self.ctrl_c.check()
    if self.queue.unpublished_batches:
      raise RuntimeError("AsyncSource.next_batch: publish(params, version) was not called after the previous "
                         "batch; the actors would wait for it forever")
    try:
      batch = self.queue.get(version=self.board.version)
    except QueueClosed as e:
      self.ctrl_c.check()
      if self.pool.error is not None:
        raise ActorPoolError(f"the actor pool failed: {self.pool.error}") from self.pool.error
      raise
    # Canonical order (group index, then session id), not completion order:
    # with several actors the learner would otherwise see a different row
    # order (so different minibatches) for the same sessions on every run.
    sessions = sorted(batch.sessions, key=lambda s: (s.group_id, s.session_id))
    counts = self.queue.counts()
    stats = self.pool.stats()
    d_busy = stats.busy_s - self._last_stats.busy_s
    d_wait = stats.wait_s - self._last_stats.wait_s
    self._last_stats = stats
    st = batch.staleness_b
    hist = np.bincount(st, minlength=self.eta + 1) if st.size else np.zeros(self.eta + 1, np.int64)
    timing = {f"time/{k}": float(sum(g.meta.get(k, 0.0) for g in batch.groups))
              for k in ("generate_s", "prefill_s", "env_s", "rollout_s")}
    # What the engines counted and the records cannot show (group prefill, decode row steps).
    counted = {k: round(sum(g.meta.get(k, 0.0) for g in batch.groups)) for k in ("prefill_saved", "decode_row_steps")}
    info = {
        **TokenLedger.from_sessions(sessions, **counted).to_metrics(), **timing,
        "rollout/rounds": 1,
        "rollout/success": float(np.mean([bool(s.success) for s in sessions])),
        "rollout/return": float(np.mean([s.episode_return for s in sessions if not s.env_error] or [0.0])),
        "rollout/env_errors": sum(bool(s.env_error) for s in sessions),
        "rollout/rewritten_replies": sum(bool(s.rewritten) for s in sessions),
        "rollout/env_timeouts": sum(bool(s.error and s.error.startswith("EnvTimeout")) for s in sessions),
        "staleness/mean": float(st.mean()) if st.size else 0.0,
        "staleness/max": float(st.max()) if st.size else 0.0,
        **{f"staleness/hist_{k}": float(hist[k]) for k in range(self.eta + 1)},
        "staleness/dropped_groups": batch.dropped_groups,
        "queue/depth": counts.queued,
        "queue/in_flight": counts.in_flight,
        "queue/started_total": counts.started,
        "queue/dropped_total": counts.dropped_sessions,
        "queue/dropped_groups_total": counts.dropped,
        "queue/abandoned_total": counts.abandoned,
        "actors/utilisation": d_busy / (d_busy + d_wait) if d_busy + d_wait > 0 else 0.0,
        "actors/restarts": stats.restarts,
        "actors/alive": stats.alive,
        "learner/idle_s": batch.waited_s,
    }
    return sessions, info

  # ----------------------------------------------------------------- shutdown
  def close(self) -> list[str]:
    """Stops the actors and joins them; returns the threads that did not stop (idempotent)."""
    if self._closed:
      return []
    self._closed = True
    self.ctrl_c.uninstall()
    alive = self.pool.stop(self.join_timeout_s)
    if alive:
      logging.warning("AsyncSource.close: threads still alive after %.1fs: %s", self.join_timeout_s, alive)
    return alive

  def __enter__(self) -> "AsyncSource":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

