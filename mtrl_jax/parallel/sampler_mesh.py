"""Host-local sampling: each host's own mesh, and the learner's weights moved onto it.

Rollouts run on every host at its own pace (async actors, env latency), so a
sampler must never call a program that spans hosts: a global program needs
every process to call it at the same moment. Each host therefore samples on
a *local mesh* over its own devices, and after each update the learner's
weights (sharded over the global mesh) are copied onto every host's local
mesh by one global program that all hosts do run together, in the learner
loop:

  1. a jitted identity lays the weights out on a "stacked" mesh over all
     devices, axes ("hosts", data, fsdp, tensor): row p is process p's local
     mesh, every weight is replicated over "hosts" and split over the local
     axes as the logical rules say. XLA inserts the gathers; this is the
     one cross-host step.
  2. every host wraps its addressable shards of the result into arrays on
     its local mesh (`jax.make_array_from_single_device_arrays`): no copy,
     no communication.

By default the local mesh is (local devices, 1, 1): the weights replicated
on every local device, as a one-host run lays them out on its mesh (the
learner's rules over a data-only mesh). When they would take more than half
a device's memory they are split over the local devices instead
((1, 1, local devices), tensor-parallel). On one process nothing moves: the
sampler uses the learner's arrays directly.

With LoRA (`moving=nnx.LoRAParam`) only the adapters move after each update:
the frozen base is sent once and again only when the learner holds new base
arrays (a warm start, a restore); the learner never rewrites the base arrays
it trains on, so their identity says whether they changed. `finish` (e.g.
folding the adapters into the weights) then runs on each host's local mesh,
after the transfer: the adapters cross hosts, the merged weights never do.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding

from mtrl_jax.parallel.mesh import AXIS_NAMES, make_mesh
from mtrl_jax.parallel.sharded_init import state_shardings

# Weights above this share of one device's memory are split over the local devices.
FIT_FRACTION = 0.5


def _tree_bytes(tree) -> int:
  return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def local_mesh_shape(param_bytes: int, devices: Sequence, requested: Sequence[int] = ()) -> tuple:
  """The local sampling mesh's shape: `requested` if given, else replicated or tensor-split (see module doc)."""
  n = len(devices)
  if requested:
    return tuple(int(s) for s in requested)
  stats = devices[0].memory_stats() if hasattr(devices[0], "memory_stats") else None
  limit = (stats or {}).get("bytes_limit")
  if limit and param_bytes > FIT_FRACTION * limit and n > 1:
    return (1, 1, n)
  return (n, 1, 1)


class _Transfer:
  """The global program that copies one tree onto every host's local mesh (steps 1 and 2)."""

  def __init__(self, tree, rules, local_mesh: Mesh, stacked_mesh: Mesh):
    self._local = state_shardings(tree, local_mesh, rules)
    stacked = jax.tree.map(lambda s: NamedSharding(stacked_mesh, s.spec), self._local)
    self._gather = jax.jit(lambda tree: tree, out_shardings=stacked)

  def __call__(self, tree):
    stacked = self._gather(tree)

    def local(x, sh):
      return jax.make_array_from_single_device_arrays(x.shape, sh, [s.data for s in x.addressable_shards])

    return jax.tree.map(local, stacked, self._local)


class SamplerWeights:
  """Moves learner weights to this host's sampling mesh (see module doc).

  Args:
    params: the learner's policy weights (shapes, dtypes, logical names).
    rules: the logical-axis rules of the learner.
    local_shape: the local mesh's shape (() = automatic, see
      `local_mesh_shape`); `config.rollout.local_mesh`.
    moving: an nnx filter of the part of `params` that changes at every
      update (LoRA: `nnx.LoRAParam`); the rest is sent only when its arrays
      change. None: everything moves every time.
    finish: a function of the whole weights on the sampling mesh, applied
      after the transfer (jitted), e.g. merging adapters into the weights.
  """

  def __init__(self, params, rules, local_shape: Sequence[int] = (), *, moving=None, finish=None):
    self.multihost = jax.process_count() > 1
    self.local_mesh = self.stacked_mesh = None
    self.moving = moving
    self._finish = jax.jit(finish) if finish is not None else None
    self.last_sent_bytes = 0  # bytes of weights the last call moved across hosts
    self._fixed_src = self._fixed_local = None
    if not self.multihost:
      return
    mine = [d for d in jax.devices() if d.process_index == jax.process_index()]
    shape = local_mesh_shape(_tree_bytes(params), mine, local_shape)
    by_process = {}
    for d in jax.devices():
      by_process.setdefault(d.process_index, []).append(d)
    counts = {p: len(ds) for p, ds in by_process.items()}
    if len(set(counts.values())) != 1:
      raise ValueError(f"host-local sampling needs the same number of devices on every process, got {counts}")
    # Every process builds every process's local mesh the same way, so the
    # stacked mesh agrees everywhere and row p is exactly process p's mesh.
    grids = [make_mesh(shape, devices=by_process[p], field="config.rollout.local_mesh").devices
             for p in sorted(by_process)]
    self.local_mesh = Mesh(grids[jax.process_index()], AXIS_NAMES, axis_types=(AxisType.Auto,) * 3)
    self.stacked_mesh = Mesh(np.stack(grids), ("hosts",) + AXIS_NAMES, axis_types=(AxisType.Auto,) * 4)
    moving_part, fixed_part = self._split(params)
    self._move = _Transfer(moving_part, rules, self.local_mesh, self.stacked_mesh)
    self._fix = _Transfer(fixed_part, rules, self.local_mesh, self.stacked_mesh) if fixed_part is not None else None
    logging.info("host-local sampling mesh %s over devices %s", shape,
                 [d.id for d in self.local_mesh.devices.flat])

  def _split(self, params):
    if self.moving is None:
      return params, None
    return nnx.split_state(params, self.moving, ...)

  def __call__(self, params):
    """The weights on this host's sampling mesh; every process must call it together (multi-host)."""
    if self.multihost:
      params = self._transfer(params)
    return self._finish(params) if self._finish is not None else params

  def _transfer(self, params):
    moving_part, fixed_part = self._split(params)
    sent = _tree_bytes(moving_part)
    out = self._move(moving_part)
    if fixed_part is None:
      self.last_sent_bytes = sent
      return out
    leaves = jax.tree.leaves(fixed_part)
    # Every process holds the same (global) arrays, so all decide alike whether to send.
    if self._fixed_src is None or len(leaves) != len(self._fixed_src) or any(
        a is not b for a, b in zip(leaves, self._fixed_src)):
      self._fixed_local = self._fix(fixed_part)
      self._fixed_src = leaves
      sent += _tree_bytes(fixed_part)
    self.last_sent_bytes = sent
    return nnx.merge_state(out, self._fixed_local)
