"""Envs by name, so a config or a sweep names an environment with a string.

  @register("memory")
  class Memory(Env): ...

  env = make("memory", length=8)
  env = make("memory", length=8, wrappers=["faulty", {"name": "latency", "median_s": 0.01}])

`make` checks the keyword arguments against the constructor signature, so a
typo in a config is an error naming the field and the env, not a silent default.
`wrappers` is applied innermost first; each item is a wrapper name or a dict
with a "name" key plus that wrapper's own keyword arguments.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import threading
from typing import Any, Callable, Iterable

from mtrl_jax.envs.base import Env

_REGISTRY: dict[str, Callable[..., Env]] = {}

# Modules whose import registers the built-in envs (imported on first use, so
# importing the registry stays cheap and free of cycles).
_BUILTIN_MODULES = (
    "mtrl_jax.envs.babyai",
    "mtrl_jax.envs.bifurcation",
    "mtrl_jax.envs.cashout",
    "mtrl_jax.envs.delayed",
    "mtrl_jax.envs.keydoor",
    "mtrl_jax.envs.memory",
    "mtrl_jax.envs.repair",
    "mtrl_jax.envs.revisit",
    "mtrl_jax.envs.textarena",
    "mtrl_jax.envs.textworld",
    "mtrl_jax.envs.wrappers",
)
_builtins_loaded = False
_builtins_lock = threading.Lock()  # actor threads may call make() for the first time at once


def _load_builtins() -> None:
  global _builtins_loaded
  if _builtins_loaded:
    return
  with _builtins_lock:
    if not _builtins_loaded:
      for module in _BUILTIN_MODULES:
        importlib.import_module(module)
      _builtins_loaded = True


def register(name: str):
  """Class decorator: registers an `Env` subclass (or factory) under `name`."""
  def deco(cls):
    if name in _REGISTRY and _REGISTRY[name] is not cls:
      raise ValueError(f"env name {name!r} is already registered to {_REGISTRY[name]!r}")
    _REGISTRY[name] = cls
    if isinstance(cls, type):
      cls.name = name
    return cls
  return deco


def names() -> list[str]:
  _load_builtins()
  return sorted(_REGISTRY)


def first_decision_fn(name: str) -> Callable[..., str | None] | None:
  """The registered env's `first_decision` (see Env) as `fn(action, observation=None)`, or None if it
  declares none. An env whose `first_decision` takes only the action gets the observation dropped."""
  _load_builtins()
  factory = _REGISTRY.get(name)
  fn = getattr(factory, "first_decision", None)
  from mtrl_jax.envs.base import Env
  if fn is None or fn is Env.first_decision:
    return None
  if len(inspect.signature(fn).parameters) >= 2:
    return fn
  return lambda action, observation=None: fn(action)


def decision_value_fn(name: str, kwargs: dict) -> Callable[[int, str], float | None] | None:
  """`decision_value` of the env `name` built with `kwargs` (see Env), or None if it has none."""
  from mtrl_jax.envs.base import Env
  _load_builtins()
  factory = _REGISTRY.get(name)
  if getattr(factory, "decision_value", Env.decision_value) is Env.decision_value:
    return None
  return make(name, **kwargs).decision_value


def check_kwargs(name: str, factory: Callable, kwargs: dict) -> None:
  """Raises a ValueError naming each keyword `factory` does not accept."""
  params = inspect.signature(factory).parameters
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
    return
  valid = [k for k, p in params.items()
           if k != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
  bad = [k for k in kwargs if k not in valid]
  if bad:
    hints = []
    for k in bad:
      close = difflib.get_close_matches(k, valid, n=1)
      hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ValueError(f"env {name!r} got unknown argument(s) {', '.join(hints)}; "
                     f"valid arguments: {', '.join(valid) or '(none)'}")


def make(name: str, *, wrappers: Iterable[Any] = (), **kwargs) -> Env:
  """Builds a registered env, then applies `wrappers` (innermost first)."""
  _load_builtins()
  if name not in _REGISTRY:
    raise ValueError(f"unknown env {name!r}; valid envs: {', '.join(sorted(_REGISTRY))}")
  factory = _REGISTRY[name]
  check_kwargs(name, factory, kwargs)
  env = factory(**kwargs)
  for w in wrappers:
    if isinstance(w, str):
      wname, wkwargs = w, {}
    elif isinstance(w, dict) and "name" in w:
      wkwargs = dict(w)
      wname = wkwargs.pop("name")
    else:
      raise ValueError(f"bad wrapper spec {w!r}: give a name or a dict with a 'name' key")
    env = make(wname, env=env, **wkwargs)
  return env
