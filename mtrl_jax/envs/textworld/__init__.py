"""TextWorld's games (coin collector, treasure hunter, cooking) as the `textworld` env.

env.py: the env (tasks, turns, rewards, experts, styles); pool.py: the games, built by
textworld's own generator once per (kind, knobs) and cached by content hash; render.py: the
terse and natural views and the reading of replies. Importing this package needs no textworld
(the registry imports it at start-up); building an env does (`pip install -e ".[benchmarks]"`).
"""
from mtrl_jax.envs.textworld.env import HELD_OUT_SEEDS, TextWorld
from mtrl_jax.envs.textworld.pool import (CHALLENGES, KNOBS, GameBuildError, PoolSpec, load_pool,
                                          parse_knobs)

__all__ = ["CHALLENGES", "HELD_OUT_SEEDS", "KNOBS", "GameBuildError", "PoolSpec", "TextWorld",
           "load_pool", "parse_knobs"]
