"""Environments: text in, text out (no jax, no models).

  from mtrl_jax import envs
  env = envs.make("memory", length=8)
  first = env.reset(seed=0)              # Reset(prompt, observation)
  out = env.step(env.expert_action())    # Step(observation, reward, terminated, truncated, info)

Built-ins: bifurcation, cashout, keydoor, memory, repair, textarena and babyai (adapters), and the latency /
faulty wrappers; `names()` lists what is registered.
"""
from mtrl_jax.envs.base import (Env, EnvError, Reset, Step, derive_seed, policy_action,
                                replay)
from mtrl_jax.envs.registry import make, names, register
from mtrl_jax.envs.wrappers import wrap

__all__ = ["Env", "EnvError", "Reset", "Step", "derive_seed", "policy_action", "replay",
           "make", "names", "register", "wrap"]
