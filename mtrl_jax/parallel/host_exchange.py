"""Host-side data between processes: Python objects gathered from every host, barriers.

The learner loop is one SPMD program across hosts, but rollouts are
host-local: each host plays its share of the tasks and the learner then
needs everyone's sessions (to pack one global batch the same way on every
host) and everyone's metrics. These helpers move such host objects with the
collectives JAX already set up (`process_allgather`): every process must
call them at the same point of its program, like any jitted global step.
One process: no communication at all.
"""
from __future__ import annotations

import pickle
from typing import Any

import jax
import numpy as np


def allgather_objects(obj: Any) -> list[Any]:
  """`[obj of process 0, obj of process 1, ...]` on every process (pickled, any size)."""
  if jax.process_count() == 1:
    return [obj]
  from jax.experimental import multihost_utils
  payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.int64(payload.size))).reshape(-1)
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:payload.size] = payload
  everyone = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
  return [pickle.loads(everyone[p, :int(n)].tobytes()) for p, n in enumerate(sizes)]


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier called `name` (no-op on one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def is_multihost() -> bool:
  return jax.process_count() > 1
