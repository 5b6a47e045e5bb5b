"""Shared helpers for env tests: run scripted episodes and record transcripts."""
from __future__ import annotations

import random

from mtrl_jax.envs import Env, derive_seed, policy_action


def run_episode(env: Env, seed: int, policy: str = "expert", quality: float = 1.0):
  """Plays one episode; returns (transcript, success). The transcript is the
  reset plus every (action, Step) pair, so two runs compare with ==."""
  rng = random.Random(derive_seed("test-policy", seed))
  transcript = [tuple(env.reset(seed))]
  while True:
    action = policy_action(env, policy, rng, quality)
    out = env.step(action)
    transcript.append((action, out.observation, out.reward, out.terminated, out.truncated,
                       sorted(out.info.items())))
    if out.terminated or out.truncated:
      return transcript, bool(out.info["success"])


def success_rate(env: Env, policy: str, episodes: int, seed0: int = 0) -> float:
  return sum(run_episode(env, seed0 + i, policy)[1] for i in range(episodes)) / episodes


def continue_with(env: Env, actions) -> list:
  """Steps `env` through `actions` (stopping at the end); returns the Steps."""
  outs = []
  for a in actions:
    out = env.step(a)
    outs.append((out.observation, out.reward, out.terminated, out.truncated,
                 sorted(out.info.items())))
    if out.terminated or out.truncated:
      break
  return outs
