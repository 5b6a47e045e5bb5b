"""Wrappers that make any env behave like a remote, unreliable one.

`latency`: each step sleeps a heavy-tailed delay (lognormal or Pareto, set by
its median, capped), as a tool call or a remote sandbox would.
`faulty`: a fraction of steps raise `EnvError` before the inner env moves, as
a crashed sandbox would.

Both are registered envs, so a config can build them by name:
  make("latency", env="memory", env_kwargs={"length": 8}, median_s=0.05)
  make("memory", length=8, wrappers=[{"name": "faulty", "rate": 0.1}, "latency"])
`env` is a registered name (with `env_kwargs`) or an `Env` instance.

Their draws are a pure function of (wrapper seed, episode seed, step, attempt),
so clones and replays see the same delays and faults as the original.
"""
from __future__ import annotations

import inspect
import math
import random
import time
from typing import Any, Callable

from mtrl_jax.envs.base import Env, EnvError, Reset, Step, derive_seed
from mtrl_jax.envs.registry import make, register


class Wrapper(Env):
  """Delegates everything to `self.env`; subclasses hook `reset` / `step`."""

  def __init__(self, env: str | Env, env_kwargs: dict | None = None, seed: int = 0):
    if isinstance(env, Env):
      if env_kwargs:
        raise ValueError(f"{type(self).__name__}: env_kwargs only apply when env is a name")
      self.env = env
    else:
      self.env = make(env, **(env_kwargs or {}))
    self.wrapper_seed = seed
    self._attempt = (-1, 0)  # (turn, attempts at that turn)

  # The episode state lives in the inner env; expose it read-only.
  max_turns = property(lambda self: self.env.max_turns)
  seed = property(lambda self: self.env.seed)
  actions = property(lambda self: self.env.actions)
  turn = property(lambda self: self.env.turn)
  done = property(lambda self: self.env.done)

  def reset(self, seed: int, session: int | None = None) -> Reset:
    self._attempt = (-1, 0)
    return self.env.reset(seed, session)

  def redraw(self, seed: int) -> None:
    self.env.redraw(seed)

  def step(self, action: str) -> Step:
    return self.env.step(action)

  def _draw(self, salt: str) -> random.Random:
    """A private RNG for this step attempt of this episode."""
    turn = self.env.turn
    attempt = self._attempt[1] + 1 if self._attempt[0] == turn else 0
    self._attempt = (turn, attempt)
    return random.Random(derive_seed(salt, self.wrapper_seed, self.env.seed, turn, attempt))

  def fresh(self) -> Env:
    args, kwargs = self._init_args
    bound = inspect.signature(type(self)).bind(*args, **kwargs).arguments
    if isinstance(bound["env"], Env):
      bound["env"] = self.env.fresh()
    return type(self)(**bound)

  def replay(self, seed=None, actions=None) -> Env:
    out = self.fresh()
    out.env = self.env.replay(seed, actions)
    return out

  def describe(self) -> str:
    return f"{self.name}[{self.env.describe()}]"

  def _reset(self, seed):
    raise NotImplementedError  # reset / step are delegated above

  def _step(self, action):
    raise NotImplementedError

  def expert_action(self) -> str:
    return self.env.expert_action()

  def random_action(self, rng: random.Random) -> str:
    return self.env.random_action(rng)

  def suboptimal_action(self, rng: random.Random) -> str:
    return self.env.suboptimal_action(rng)

  def __getattr__(self, name: str) -> Any:
    # Game-specific attributes (e.g. a memory env's `code`) stay reachable.
    if name == "env":
      raise AttributeError(name)
    return getattr(self.env, name)


@register("latency")
class Latency(Wrapper):
  """Sleeps a heavy-tailed delay before each step."""

  def __init__(self, env: str | Env, env_kwargs: dict | None = None, median_s: float = 0.05,
               dist: str = "lognormal", sigma: float = 1.0, alpha: float = 1.5,
               cap_s: float | None = None, seed: int = 0):
    """
    Args:
      env, env_kwargs: the wrapped env (a registered name + kwargs, or an Env).
      median_s: median delay per step in seconds.
      dist: 'lognormal' (log-sd `sigma`) or 'pareto' (tail index `alpha`;
        smaller is heavier).
      cap_s: longest delay; default 20 * median_s.
      seed: seeds the delays (mixed with the episode seed and step).
    """
    super().__init__(env, env_kwargs, seed)
    if dist not in ("lognormal", "pareto"):
      raise ValueError(f"latency: dist must be 'lognormal' or 'pareto', got {dist!r}")
    if median_s < 0:
      raise ValueError(f"latency: median_s must be >= 0, got {median_s}")
    self.median_s, self.dist, self.sigma, self.alpha = median_s, dist, sigma, alpha
    self.cap_s = 20 * median_s if cap_s is None else cap_s
    self.sleep: Callable[[float], None] = time.sleep

  def sample_delay(self, rng: random.Random) -> float:
    if self.dist == "lognormal":
      d = self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))
    else:  # Pareto with this median: x_m * 2 ** (1 / alpha) = median
      d = self.median_s * 2 ** (-1 / self.alpha) * rng.paretovariate(self.alpha)
    return min(d, self.cap_s)

  def step(self, action: str) -> Step:
    delay = self.sample_delay(self._draw("latency"))
    if delay > 0:
      self.sleep(delay)
    out = self.env.step(action)
    out.info["latency_s"] = delay
    return out


@register("faulty")
class Faulty(Wrapper):
  """Raises `EnvError` on a fraction `rate` of step attempts (the env does not move)."""

  def __init__(self, env: str | Env, env_kwargs: dict | None = None, rate: float = 0.2,
               seed: int = 0):
    """
    Args:
      env, env_kwargs: the wrapped env (a registered name + kwargs, or an Env).
      rate: probability that a step attempt raises EnvError.
      seed: seeds the faults (mixed with the episode seed, step and attempt, so
        a retried step may succeed).
    """
    super().__init__(env, env_kwargs, seed)
    if not 0.0 <= rate <= 1.0:
      raise ValueError(f"faulty: rate must be in [0, 1], got {rate}")
    self.rate = rate

  def step(self, action: str) -> Step:
    if self._draw("faulty").random() < self.rate:
      raise EnvError(f"{self.describe()}: injected fault at turn {self.env.turn}")
    return self.env.step(action)


def wrap(env: Env, name: str, **kwargs) -> Env:
  """Applies the registered wrapper `name` to an existing env."""
  return make(name, env=env, **kwargs)

