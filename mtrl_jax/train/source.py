"""Where finished sessions come from: the learner's only view of rollout.

`SessionSource.next_batch(step)` returns the sessions for update `step`. The
synchronous source plays them now with the current weights; the async actor
pool (mtrl_jax/rollout/actors.py) implements the same call from its queue.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol, Sequence

import jax
import numpy as np

from mtrl_jax.config import HELD_OUT_SEEDS
from mtrl_jax.credit.shaping import informative_groups_np
from mtrl_jax.rollout.ownership import HostShare, group_key, host_share
from mtrl_jax.rollout.session import Session


class SessionSource(Protocol):
  def next_batch(self, step: int) -> tuple[list[Session], dict]: ...
  def close(self) -> None: ...


def task_seeds(seed: int, step: int, n: int, round_: int = 0) -> list[int]:
  """Training task seeds of update `step`: a pure function, so a resumed run replays them.

  Never in `HELD_OUT_SEEDS`: a draw that lands there (about 1 in 1000) is
  moved past it, so evaluation plays tasks no training step has seen.
  """
  rng = np.random.default_rng([seed, step, round_, 11])
  lo, hi = HELD_OUT_SEEDS.start, HELD_OUT_SEEDS.stop
  return [int(x) + (hi - lo if lo <= x < hi else 0) for x in rng.integers(0, 2**31 - 1 - (hi - lo), n)]


class SyncSource:
  """Plays T tasks x G sessions with the engine, blocking, for each update.

  With `share` (several hosts) it plays only that host's block of the T
  groups; seeds, group ids and keys are those the block's groups have in a
  one-host run (rollout/ownership.py), so the union of all hosts' sessions is
  the one-host batch.
  """

  def __init__(self, engine, *, seed: int, tasks_per_update: int, dynamic_sampling: bool = False,
               max_resample_rounds: int = 0, share: HostShare | None = None, progress=None):
    self.engine, self.seed, self.tasks = engine, seed, tasks_per_update
    # progress(label, total) -> the engine's on_done hook (evaluate.session_bar): an update's sessions
    # can take minutes on a CPU with a real model; None for an engine without the hook (trees).
    self.progress = progress
    self.dynamic_sampling, self.max_rounds = dynamic_sampling, max_resample_rounds
    self.share = share or host_share(tasks_per_update, 0, 1)
    self.key = jax.random.key(seed)

  def _round(self, step: int, r: int):
    seeds = task_seeds(self.seed, step, self.tasks, r)
    js = self.share.indices
    # Redraw rounds (dynamic sampling) get their own block of group ids.
    first = (step * (self.max_rounds + 1) + r) * self.tasks
    watch = {}
    if self.progress is not None:
      label = f"rl rollout {step + 1}" + (f" round {r + 1}" if r else "")
      watch["on_done"] = self.progress(label, len(js) * self.engine.group_size)
    return self.engine.run([seeds[j] for j in js], group_keys=[group_key(self.key, step, j, r) for j in js],
                           group_ids=[first + j for j in js], **watch)

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
      while informative(sessions) < self.share.size and rounds <= self.max_rounds:
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
            "rollout/rewritten_replies": sum(bool(s.rewritten) for s in sessions),
            "staleness/max": 0.0, "staleness/mean": 0.0}
    return sessions, info

  def close(self) -> None:
    pass


_RATIOS = {"ledger/turns_per_session": ("ledger/turns", "ledger/sessions"),
           "ledger/generated_per_turn": ("ledger/tokens_generated", "ledger/turns"),
           "ledger/slot_utilisation": ("ledger/tokens_generated", "ledger/decode_row_steps")}


def merge_host_infos(infos: Sequence[dict], sessions: Sequence[Session]) -> dict:
  """One update's metrics from every host's `next_batch` info, and all hosts' sessions.

  Token-ledger counts add up (their ratios are recomputed), the rollout
  outcome metrics are recomputed from the global sessions, staleness takes
  the worst host for maxima, and everything else (timings, queue and actor
  statistics) is the mean over hosts.
  """
  out = {}
  for k in sorted({k for i in infos for k in i}):
    vals = [float(i[k]) for i in infos if k in i]
    if k.startswith("ledger/") or k.startswith("staleness/hist_") or k.endswith("_total"):
      out[k] = float(np.sum(vals))
    elif k.endswith("/max"):
      out[k] = float(np.max(vals))
    else:
      out[k] = float(np.mean(vals))
  for k, (num, den) in _RATIOS.items():
    if num in out and den in out:
      out[k] = out[num] / max(out[den], 1.0)
  if "ledger/sessions" in out:
    out["ledger/success_rate"] = float(np.mean([bool(s.success) for s in sessions])) if sessions else 0.0
  out.update({
      "rollout/success": float(np.mean([bool(s.success) for s in sessions])) if sessions else 0.0,
      "rollout/return": float(np.mean([s.episode_return for s in sessions if not s.env_error] or [0.0])),
      "rollout/env_errors": sum(bool(s.env_error) for s in sessions),
      "rollout/rewritten_replies": sum(bool(s.rewritten) for s in sessions),
      "rollout/hosts": len(infos)})
  return out


class Chosen(NamedTuple):
  """The sessions an update trains on, and what was left out."""
  sessions: list
  stats: dict


def choose_sessions(sessions: Sequence[Session], version: int, *, dynamic_sampling: bool) -> Chosen:
  """The trainable sessions of a batch; with dynamic sampling, only the groups whose returns differ.

  Stats: how many were untrainable, dropped, trained, and the oldest policy version among the
  trained tokens (measured from the versions recorded on the tokens, whatever the source claims).
  """
  trainable = [s for s in sessions if s.trainable]
  stats = {"sessions/untrainable": len(sessions) - len(trainable)}
  if dynamic_sampling:
    keep, dropped = informative_groups_np([s.group_id for s in trainable], [s.episode_return for s in trainable])
    stats["sessions/dropped_uninformative_groups"] = dropped
    trainable = [s for s, k in zip(trainable, keep) if k]
  stats["sessions/trained"] = len(trainable)
  oldest = [v for v in (s.min_version() for s in trainable) if v is not None]
  stats["update/staleness_max"] = float(max((version - v for v in oldest), default=0))
  return Chosen(trainable, stats)
