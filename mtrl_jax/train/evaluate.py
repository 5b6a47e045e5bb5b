"""Evaluation on held-out task seeds, sampled and greedy.

`eval/success` is the success rate of the policy as it is trained and
deployed in rollouts: sampled at the rollout temperature. Greedy decoding is
reported beside it (`eval/greedy_*`); on a near-even choice between two
actions argmax flips on tiny logit differences, so greedy success says little
about a policy that is still mixing.

A long eval (SmolLM2 on BabyAI: ~20 minutes on 2 cores) shows its sessions
ending on a console bar (`session_bar`, fed by the engines' `on_done` hook).
"""
from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from mtrl_jax.metrics import Progress
from mtrl_jax.parallel.host_exchange import allgather_objects
from mtrl_jax.rollout.engine import OnDone
from mtrl_jax.rollout.ledger import TokenLedger
from mtrl_jax.rollout.ownership import HostShare
from mtrl_jax.rollout.session import Session

# Seconds an eval's bar stays silent: the evals between RL updates of a small job end sooner and print nothing.
BAR_QUIET_S = 5.0


def decision_shares(sessions: list[Session], prefix: str, decision_fn) -> dict:
  """`{prefix}decision_<d>`: the share of sessions whose turn-0 decision (Env.first_decision, called
  as registry.first_decision_fn's `fn(action, observation)`) is d: e.g. how often the policy takes the
  arm `delayed`'s sign shows (`eval/decision_cued`), sampled and greedy, beside the success rate."""
  if decision_fn is None or not sessions:
    return {}
  got = [decision_fn(s.turns[0].action, s.turns[0].observation) for s in sessions if s.turns]
  return {f"{prefix}decision_{d}": got.count(d) / len(sessions) for d in sorted(set(got) - {None})}


def session_stats(sessions: list[Session], prefix: str, decision_fn=None) -> dict:
  n = max(len(sessions), 1)
  ok = [s for s in sessions if not s.env_error]
  return {**decision_shares(sessions, prefix, decision_fn),
      f"{prefix}success": sum(bool(s.success) for s in sessions) / n,
      f"{prefix}return": float(np.mean([s.episode_return for s in ok])) if ok else 0.0,
      f"{prefix}turns": float(np.mean([s.num_turns for s in sessions])) if sessions else 0.0,
      f"{prefix}tokens_per_session": float(np.mean(
          [s.num_action_tokens + s.num_obs_tokens for s in sessions])) if sessions else 0.0,
      f"{prefix}env_errors": sum(bool(s.env_error) for s in sessions),
      f"{prefix}rewritten_replies": sum(bool(s.rewritten) for s in sessions),
  }


def session_bar(label: str, total: int, quiet_s: float = BAR_QUIET_S, stream=None) -> OnDone:
  """An engine's `on_done` hook that draws `[label] |###...| ended/total` with the success rate and
  the tokens (prefilled + generated) so far, on the job's console bar (metrics.Progress: redrawn in
  place on a terminal, a line every 5 s in a log; nothing for the first `quiet_s` seconds)."""
  bar = Progress(label, total, stream=stream, quiet_s=quiet_s)

  def on_done(n_done: int, n_total: int, ledger: TokenLedger) -> None:
    bar.update(n_done, success=ledger.successes / max(n_done, 1),
               tokens=ledger.generated_total + ledger.prefilled_total)
  return on_done


def play_share(engine, seeds, rng, share: HostShare | None = None, on_done: OnDone | None = None) -> list[Session]:
  """The sessions of this host's share of `seeds`, each keyed by its index: task j
  plays with `fold_in(rng, j)` and group id j, whichever host plays it; `on_done` hears of
  each session of this host as it ends."""
  js = range(len(seeds)) if share is None else share.indices
  watch = {} if on_done is None else {"on_done": on_done}  # the tree engine takes no hook
  return engine.run([seeds[j] for j in js], group_keys=[jax.random.fold_in(rng, j) for j in js],
                    group_ids=list(js), **watch).sessions


def evaluate(engine_sampled, engine_greedy, seeds, rng, share: HostShare | None = None, decision_fn=None,
             progress: Callable[[str, int], OnDone] | None = None) -> dict:
  """`eval/success` (sampled) and, given a greedy engine, `eval/greedy_success`; returns, turns, tokens;
  with the env's `decision_fn`, the shares of its turn-0 decisions (`decision_shares`).

  With `share` (several hosts) each host plays its block of the seeds and the
  statistics cover every host's sessions (all hosts must call this together).
  `progress(which, sessions)`, given, makes the `on_done` hook of this host's
  `"sampled"` and `"greedy"` plays (e.g. `session_bar`); it sees, never steers.
  """
  def everyone(sessions):
    return sorted(sum(allgather_objects(sessions), []), key=lambda s: s.group_id)

  def play(engine, which):
    tasks = len(seeds) if share is None else len(share.indices)
    hook = None if progress is None else progress(which, tasks * engine.group_size)
    return everyone(play_share(engine, seeds, rng, share, on_done=hook))

  out = session_stats(play(engine_sampled, "sampled"), "eval/", decision_fn)
  if engine_greedy is not None:
    out.update(session_stats(play(engine_greedy, "greedy"), "eval/greedy_", decision_fn))
  return out
