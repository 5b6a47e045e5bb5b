"""Jitted programs shared by every run in this process, each keyed by the spec that builds it.

`jax.jit` keeps its compiled programs on the jitted object, and a jitted
closure built afresh (per Run, per Learner, per Sampler) is a new object: a
second run in the same process, with the same shapes, would trace and compile
every step again. Built through `shared(spec)`, the second run gets the first
run's jitted object back (and with it every program it compiled) when its
spec is equal.

A spec is a frozen dataclass (subclass `Program`) whose fields are everything
its `build()` reads: graphdefs, optax transformations (`train/optim.py`
returns one object per recipe, so identity is equality), loss settings,
shardings (wrapped in `Tree`). The spec itself is the key, so a setting the
builder reads cannot be left out of the key: to reach the builder it has to be
a field. Arrays must never be fields (they would be baked in as constants):
pass them to the built program as arguments.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Hashable, Mapping
from typing import Any

import jax

_PROGRAMS: dict[Hashable, Any] = {}
_LOCK = threading.Lock()  # actor threads may build a sampler while the learner builds its steps


class Program:
  """The base of a shared program's spec: subclasses are frozen dataclasses whose fields are the key
  and `build`'s only inputs."""

  def build(self) -> Any:
    raise NotImplementedError


def shared(spec: Program) -> Any:
  """`spec.build()` (a jitted function, or an object holding them) once per equal spec in this process."""
  _check_spec(spec)
  with _LOCK:
    if spec not in _PROGRAMS:
      _PROGRAMS[spec] = spec.build()
    return _PROGRAMS[spec]


def _check_spec(spec) -> None:
  cls = type(spec)
  if not (isinstance(spec, Program) and dataclasses.is_dataclass(spec) and cls.__dataclass_params__.frozen):
    raise TypeError(f"{cls.__name__}: a shared program's spec must be a frozen dataclass subclassing Program")
  hidden = [f.name for f in dataclasses.fields(spec) if not (f.compare and f.hash is not False)]
  if hidden:  # a field out of the comparison is a field out of the key
    raise TypeError(f"{cls.__name__}: fields {hidden} are left out of the key (compare/hash=False)")


class Tree:
  """A pytree of hashable leaves (e.g. shardings) as a spec field: equal when structure and leaves are.

  None leaves (a missing critic's shardings) are kept as None. `.value` is the tree.
  """
  __slots__ = ("value", "_key")

  def __init__(self, value):
    self.value = value
    leaves, treedef = jax.tree.flatten(value, is_leaf=lambda x: x is None)
    self._key = (treedef, tuple(leaves))

  def __eq__(self, other):
    return isinstance(other, Tree) and self._key == other._key

  def __hash__(self):
    return hash(self._key)

  def __repr__(self):
    return f"Tree({self.value!r})"


def frozen(options: Mapping | None) -> tuple:
  """A mapping of options as a hashable spec field: sorted (name, value) pairs, lists as tuples.

  `dict(frozen(x))` gives the options back."""
  def freeze(v):
    if isinstance(v, Mapping):
      return frozen(v)
    if isinstance(v, (list, tuple)):
      return tuple(freeze(x) for x in v)
    return v
  return tuple(sorted((str(k), freeze(v)) for k, v in dict(options or {}).items()))


def clear() -> None:
  """Forgets every shared program (tests; a process that wants its memory back)."""
  with _LOCK:
    _PROGRAMS.clear()


def size() -> int:
  """How many shared programs this process holds."""
  return len(_PROGRAMS)


def held() -> dict:
  """A copy of what this process holds, for `give_back` (a test that empties the registry)."""
  with _LOCK:
    return dict(_PROGRAMS)


def give_back(programs: dict) -> None:
  """The registry as `held()` saw it (a test's own programs forgotten)."""
  with _LOCK:
    _PROGRAMS.clear()
    _PROGRAMS.update(programs)
