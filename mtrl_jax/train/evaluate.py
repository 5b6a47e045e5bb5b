"""Evaluation on held-out task seeds, sampled and greedy.

`eval/success` is the success rate of the policy as it is trained and
deployed in rollouts: sampled at the rollout temperature. Greedy decoding is
reported beside it (`eval/greedy_*`); on a near-even choice between two
actions argmax flips on tiny logit differences, so greedy success says little
about a policy that is still mixing.
"""
from __future__ import annotations

import jax
import numpy as np

from mtrl_jax.parallel.host_exchange import allgather_objects
from mtrl_jax.rollout.ownership import HostShare
from mtrl_jax.rollout.session import Session


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


def play_share(engine, seeds, rng, share: HostShare | None = None) -> list[Session]:
  """The sessions of this host's share of `seeds`, each keyed by its index: task j
  plays with `fold_in(rng, j)` and group id j, whichever host plays it."""
  js = range(len(seeds)) if share is None else share.indices
  return engine.run([seeds[j] for j in js], group_keys=[jax.random.fold_in(rng, j) for j in js],
                    group_ids=list(js)).sessions


def evaluate(engine_sampled, engine_greedy, seeds, rng, share: HostShare | None = None, decision_fn=None) -> dict:
  """`eval/success` (sampled) and, given a greedy engine, `eval/greedy_success`; returns, turns, tokens;
  with the env's `decision_fn`, the shares of its turn-0 decisions (`decision_shares`).

  With `share` (several hosts) each host plays its block of the seeds and the
  statistics cover every host's sessions (all hosts must call this together).
  """
  def everyone(sessions):
    return sorted(sum(allgather_objects(sessions), []), key=lambda s: s.group_id)

  out = session_stats(everyone(play_share(engine_sampled, seeds, rng, share)), "eval/", decision_fn)
  if engine_greedy is not None:
    out.update(session_stats(everyone(play_share(engine_greedy, seeds, rng, share)), "eval/greedy_", decision_fn))
  return out
