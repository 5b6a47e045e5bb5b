"""A sampler on its own devices: one host's (or a slice's) chips split between
a sampler mesh and a learner mesh (`config.rollout.devices`).

Shared devices (the default, `rollout.devices = 0`) time-slice every chip
between decoding and training. With a split, the last `rollout.devices`
devices form the sampler's mesh (`rollout.local_mesh`, default all of them on
its data axis: weights replicated, decode rows split over them) and the rest
the learner's (`config.mesh`). After each update the learner's weights move
to the sampler's devices: one `jax.device_put` onto the sampler's shardings,
a resharding transfer between disjoint device sets (XLA copies each shard
to where the target layout wants it), as the multi-host path moves the
weights to every host's local mesh (sampler_mesh.py). The sampler's copy is
its own: the learner's next (donating) step cannot invalidate it.

One process only: on several hosts every host already samples on its own
devices (sampler_mesh.py); splitting each host's devices further is not
wired yet.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
from absl import logging

from mtrl_jax.parallel.mesh import make_mesh
from mtrl_jax.parallel.sharded_init import state_shardings


class DeviceSplit(NamedTuple):
  """Which devices sample and which train (the same tuple twice when shared)."""
  sampler: tuple
  learner: tuple

  @property
  def shared(self) -> bool:
    return self.sampler == self.learner


def split_devices(sampler_count: int, devices: Sequence | None = None, *,
                  field: str = "config.rollout.devices") -> DeviceSplit:
  """The last `sampler_count` devices sample, the others train (0: all do both)."""
  devices = tuple(sorted(jax.devices() if devices is None else devices, key=lambda d: (d.process_index, d.id)))
  n = int(sampler_count)
  if n == 0:
    return DeviceSplit(devices, devices)
  if not 0 < n < len(devices):
    raise ValueError(f"{field}={sampler_count}: must be 0 (shared) or leave the learner at least one of the "
                     f"{len(devices)} devices")
  if jax.process_count() > 1:
    raise ValueError(f"{field}={sampler_count}: a sampler/learner device split runs on one process; on "
                     f"several hosts each host already samples on its own devices (rollout.local_mesh)")
  return DeviceSplit(devices[len(devices) - n:], devices[:len(devices) - n])


class SplitSamplerWeights:
  """Moves the learner's weights onto the sampler's devices (see module doc).

  Args:
    params: the learner's policy weights (shapes, dtypes, logical names).
    rules: the learner's logical-axis rules (the sampler's layout follows them).
    devices: the sampler's devices.
    local_shape: the sampler mesh's shape (`config.rollout.local_mesh`; ():
      (len(devices), 1, 1), weights replicated, rows split).
    finish: a function of the weights on the sampler's devices, applied after
      each copy (LoRA: the adapters merged into the base, train/adapters.py).
  """

  multihost = False

  def __init__(self, params, rules, devices: Sequence, local_shape: Sequence[int] = (), *, finish=None):
    shape = tuple(local_shape) or (len(devices), 1, 1)
    self.mesh = make_mesh(shape, devices=list(devices), field="config.rollout.local_mesh")
    self.local_mesh = self.mesh
    self._shardings = state_shardings(params, self.mesh, rules)
    self._finish = jax.jit(finish) if finish is not None else None
    logging.info("sampler mesh %s over devices %s (the learner keeps the others)", shape,
                 [d.id for d in self.mesh.devices.flat])

  def __call__(self, params):
    """The weights laid out on the sampler's mesh: a copy, on its devices only."""
    out = jax.device_put(params, self._shardings)
    return self._finish(out) if self._finish is not None else out
