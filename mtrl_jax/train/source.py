"""Where finished sessions come from: the learner's only view of rollout.

`SessionSource.next_batch(step)` returns the sessions for update `step`. The
synchronous source plays them now with the current weights; the async actor
pool (mtrl_jax/rollout/actors.py) implements the same call from its queue.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import jax
import numpy as np

from mtrl_jax.credit.shaping import informative_groups_np
from mtrl_jax.rollout.session import Session


class SessionSource(Protocol):
  def next_batch(self, step: int) -> tuple[list[Session], dict]: ...
  def close(self) -> None: ...


def task_seeds(seed: int, step: int, n: int, round_: int = 0) -> list[int]:
  """Training task seeds of update `step`: a pure function, so a resumed run replays them."""
  rng = np.random.default_rng([seed, step, round_, 11])
  return [int(x) for x in rng.integers(0, 2**31 - 1, n)]


class SyncSource:
  """Plays B tasks x G sessions with the engine, blocking, for each update."""

  def __init__(self, engine, *, seed: int, tasks_per_update: int, dynamic_sampling: bool = False,
               max_resample_rounds: int = 0):
    self.engine, self.seed, self.tasks = engine, seed, tasks_per_update
    self.dynamic_sampling, self.max_rounds = dynamic_sampling, max_resample_rounds
    self.key = jax.random.key(seed)

  def _round(self, step: int, r: int):
    res = self.engine.run(task_seeds(self.seed, step, self.tasks, r),
                          jax.random.fold_in(jax.random.fold_in(self.key, step), r))
    return res

  def next_batch(self, step: int) -> tuple[list[Session], dict]:
    res = self._round(step, 0)
    sessions, ledger = list(res.sessions), res.ledger
    timing = {"time/generate_s": res.timing.generate_s, "time/prefill_s": res.timing.prefill_s,
              "time/env_s": res.timing.env_s, "time/rollout_s": res.timing.total_s}
    rounds = 1
    if self.dynamic_sampling:
      # DAPO: keep drawing rounds until B informative groups are in (or the bound).
      def informative(ss):
        ok = [s for s in ss if s.trainable]
        keep, _ = informative_groups_np([s.group_id for s in ok], [s.episode_return for s in ok])
        return len({s.group_id for s, k in zip(ok, keep) if k})
      while informative(sessions) < self.tasks and rounds <= self.max_rounds:
        extra = self._round(step, rounds)
        sessions += extra.sessions
        ledger = ledger.merge(extra.ledger)
        for k, v in (("time/generate_s", extra.timing.generate_s), ("time/prefill_s", extra.timing.prefill_s),
                     ("time/env_s", extra.timing.env_s), ("time/rollout_s", extra.timing.total_s)):
          timing[k] += v
        rounds += 1
    info = {**ledger.to_metrics(), **timing, "rollout/rounds": rounds,
            "rollout/success": float(np.mean([bool(s.success) for s in sessions])),
            "rollout/return": float(np.mean([s.episode_return for s in sessions if not s.env_error] or [0.0])),
            "rollout/env_errors": sum(bool(s.env_error) for s in sessions),
            "staleness/max": 0.0, "staleness/mean": 0.0}
    return sessions, info

  def close(self) -> None:
    pass
