"""Play an env with a scripted policy and summarise; the last line is JSON.

  python -m mtrl_jax.envs.play --env memory --policy expert --episodes 100
  python -m mtrl_jax.envs.play --env textarena --env_kwargs '{"game": "FrozenLake-v0"}' \
      --policy random --episodes 20 --show 1

An `EnvError` (e.g. from the `faulty` wrapper) ends only that episode and is
counted in `env_errors`; such episodes are left out of the success and return
means.
"""
from __future__ import annotations

import json
import random
import time
from typing import Sequence

from absl import app, flags

from mtrl_jax.envs.base import Env, EnvError, derive_seed, policy_action
from mtrl_jax.envs.registry import make


def play_episode(env: Env, seed: int, policy: str, quality: float = 1.0,
                 show: bool = False) -> dict:
  """One episode; returns its summary (raises EnvError if the env fails)."""
  rng = random.Random(derive_seed("policy", seed))  # never correlated with the env's RNG
  first = env.reset(seed)
  if show:
    print(f"--- seed {seed} | prompt: {first.prompt}\n{first.observation}")
  ret, invalid = 0.0, 0
  while True:
    action = policy_action(env, policy, rng, quality)
    out = env.step(action)
    ret += out.reward
    invalid += bool(out.info.get("invalid_action"))
    if show:
      print(f">>> {action}   (r={out.reward:+g})\n{out.observation}")
    if out.terminated or out.truncated:
      return {"return": ret, "success": bool(out.info.get("success")), "turns": env.turn,
              "invalid": invalid, "truncated": out.truncated}


def play(env_name: str, env_kwargs: dict, policy: str, episodes: int, seed: int = 0,
         quality: float = 1.0, show: int = 0) -> dict:
  env = make(env_name, **env_kwargs)
  results, errors = [], 0
  start = time.perf_counter()
  for i in range(episodes):
    try:
      results.append(play_episode(env, seed + i, policy, quality, show=i < show))
    except EnvError as e:
      errors += 1
      if i < show:
        print(f"!!! env error: {e}")
  n = max(len(results), 1)
  turns = sum(r["turns"] for r in results)
  return {
      "env": env_name, "env_kwargs": env_kwargs, "policy": policy, "quality": quality,
      "episodes": episodes,
      "success_rate": sum(r["success"] for r in results) / n,
      "mean_return": sum(r["return"] for r in results) / n,
      "mean_turns": turns / n,
      "invalid_rate": sum(r["invalid"] for r in results) / max(turns, 1),
      "truncated_rate": sum(r["truncated"] for r in results) / n,
      "env_errors": errors,
      "seconds": round(time.perf_counter() - start, 3),
  }


def define_flags() -> None:
  """CLI flags; defined on demand so importing this module defines none."""
  flags.DEFINE_string("env", "memory", "Registered env name.")
  flags.DEFINE_string("env_kwargs", "{}", "JSON dict of env keyword arguments.")
  flags.DEFINE_enum("policy", "expert", ["expert", "random"], "Scripted policy.")
  flags.DEFINE_float("quality", 1.0, "Expert only: probability of the expert action (else a "
                     "random one).")
  flags.DEFINE_integer("episodes", 10, "Episodes to play.")
  flags.DEFINE_integer("seed", 0, "Episode i uses env seed seed + i.")
  flags.DEFINE_integer("show", 0, "Print the transcript of this many episodes.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  kwargs = json.loads(f.env_kwargs)
  s = play(f.env, kwargs, f.policy, f.episodes, f.seed, f.quality, f.show)
  print(f"{s['env']} {json.dumps(kwargs)} | policy {s['policy']} | {s['episodes']} episodes")
  print(f"  success {s['success_rate']:.3f}  return {s['mean_return']:+.3f}  "
        f"turns {s['mean_turns']:.2f}  invalid/turn {s['invalid_rate']:.3f}  "
        f"truncated {s['truncated_rate']:.3f}  env errors {s['env_errors']}  ({s['seconds']} s)")
  print(json.dumps(s))


if __name__ == "__main__":
  define_flags()
  app.run(main)
