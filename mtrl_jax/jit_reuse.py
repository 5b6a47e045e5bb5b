"""Jitted programs shared by every run in this process, keyed by what determines them.

`jax.jit` keeps its compiled programs on the jitted object, and a jitted
closure built afresh (per Run, per Learner, per Sampler) is a new object: a
second run in the same process, with the same shapes, traced and compiled
every step again. Built through `shared_jit`, the second run gets the first
run's jitted object back (and with it every program it compiled) when its key
is equal.

The key must name everything the built function closes over that changes the
program: graphdefs (hashable and equal for equal model structures), optax
transformations (`train/optim.py` returns the same object for the same
arguments, so identity is enough), loss settings, shardings (flattened with
`tree_key`). A value left out of the key is a silent bug: two runs that
differ in it would share the first one's program. Arrays must never be in the
closure (they would be baked in as constants): pass them as arguments.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

import jax

_PROGRAMS: dict[Hashable, Any] = {}
_LOCK = threading.Lock()  # actor threads may build a sampler while the learner builds its steps


def shared_jit(key: Hashable, build: Callable[[], Any]) -> Any:
  """`build()` (a jitted function, or an object holding them) once per `key` in this process."""
  with _LOCK:
    if key not in _PROGRAMS:
      _PROGRAMS[key] = build()
    return _PROGRAMS[key]


def tree_key(tree) -> Hashable:
  """A hashable stand-in for a pytree of hashable leaves (e.g. shardings): (structure, leaves).

  None leaves (a missing critic's shardings) are kept as None.
  """
  leaves, treedef = jax.tree.flatten(tree, is_leaf=lambda x: x is None)
  return treedef, tuple(leaves)


def clear() -> None:
  """Forgets every shared program (tests; a process that wants its memory back)."""
  with _LOCK:
    _PROGRAMS.clear()


def size() -> int:
  """How many shared programs this process holds."""
  return len(_PROGRAMS)
