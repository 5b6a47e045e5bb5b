"""Tiny TextWorld pools shared by the textworld tests: built once, cached in the usual data folder.

The games are prefixes of the pools a run with the same knobs uses (the same tw-make seeds),
so a machine that ran the tests once rebuilds nothing; a fresh one builds the 11 games here
(~30 s of CPU) the first time.
"""
from __future__ import annotations

import random

from mtrl_jax import envs

# kind -> (tw-make knobs, train games, eval games)
TINY = {
    "coin_collector": ({"level": 3}, 3, 2),
    "treasure_hunter": ({"level": 3}, 2, 1),
    # Doors, containers, several rooms, cutting and cooking: every part of the terse view.
    "cooking": ({"recipe": 2, "take": 1, "go": 6, "open": True, "cook": True, "cut": True}, 2, 1),
}


def tiny_env(kind: str, **kw) -> envs.Env:
  knobs, games, eval_games = TINY[kind]
  return envs.make("textworld", kind=kind, games=games, eval_games=eval_games, **{**knobs, **kw})


def all_seeds(env) -> list[int]:
  """Task seeds reaching every game of the pool once: training games, then evaluation games."""
  from mtrl_jax.envs.textworld import HELD_OUT_SEEDS
  return list(range(len(env.pool.train))) + [HELD_OUT_SEEDS.start + j for j in range(len(env.pool.eval))]


def play(env, seed: int, actions=None, policy: str = "expert", rng_seed: int = 0, limit: int = 200):
  """Plays a session (a fixed action list, or a policy); returns (reset, steps, actions)."""
  rng = random.Random(rng_seed)
  first = env.reset(seed)
  steps, taken = [], []
  for i in range(limit):
    if actions is not None:
      if i >= len(actions):
        break
      a = actions[i]
    else:
      a = env.expert_action() if policy == "expert" else env.random_action(rng)
    out = env.step(a)
    steps.append(out)
    taken.append(a)
    if out.terminated or out.truncated:
      break
  return first, steps, taken
