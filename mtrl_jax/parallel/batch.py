"""Placing a host batch on the mesh: rows split over the `batch` mesh axes.

Every leaf of a batch is [B, ...] with the same B. On one host the whole
global batch is put on the devices; on several, each host passes only the
rows its devices hold (`process_batch_rows` says which) and the global array
is assembled from the pieces.
"""
from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mtrl_jax.parallel.rules import Rules, mesh_axes, normalize_axes
from mtrl_jax.parallel.tree_paths import path_str


def batch_axes(mesh: Mesh, rules: Rules) -> tuple:
  """The mesh axes the batch dimension is split over."""
  axes = mesh_axes(rules, "batch")
  for a in axes:
    if a not in mesh.axis_names:
      raise ValueError(f"config.mesh.rules maps 'batch' to mesh axis {a!r}, which the mesh lacks "
                       f"(mesh axes: {tuple(mesh.axis_names)})")
  return axes


def num_batch_shards(mesh: Mesh, rules: Rules) -> int:
  return math.prod(mesh.shape[a] for a in batch_axes(mesh, rules))


def batch_sharding(mesh: Mesh, rules: Rules, ndim: int) -> NamedSharding:
  """Sharding of a [B, T, ...] array of `ndim` dims: B over the batch axes, the rest replicated."""
  if ndim < 1:
    raise ValueError(f"a batch array needs a leading batch dimension; got ndim={ndim}")
  lead = normalize_axes(batch_axes(mesh, rules))
  return NamedSharding(mesh, PartitionSpec(lead, *([None] * (ndim - 1))))


def check_batch_divisible(batch_size: int, mesh: Mesh, rules: Rules, *, field: str = "batch_size") -> None:
  """Raises when `batch_size` rows cannot be split evenly over the batch mesh axes."""
  axes = batch_axes(mesh, rules)
  n = num_batch_shards(mesh, rules)
  if batch_size % n:
    sizes = ", ".join(f"{a}={mesh.shape[a]}" for a in axes)
    raise ValueError(f"{field}={batch_size} is not divisible by the {n} batch shards of mesh axes "
                     f"{axes} ({sizes}); use a multiple of {n} or change config.mesh.shape")


def _local_shard_ids(mesh: Mesh, rules: Rules) -> list:
  """Indices (along the flattened batch axes) of the row blocks this process's devices hold."""
  axes = batch_axes(mesh, rules)
  pos = [mesh.axis_names.index(a) for a in axes]
  sizes = [mesh.shape[a] for a in axes]
  me = jax.process_index()
  ids = set()
  for coord, dev in np.ndenumerate(mesh.devices):
    if dev.process_index == me:
      ids.add(int(np.ravel_multi_index([coord[p] for p in pos], sizes)) if pos else 0)
  return sorted(ids)


def process_batch_rows(global_batch_size: int, mesh: Mesh, rules: Rules) -> slice:
  """The rows of the global batch this process must feed (all rows on one host)."""
  check_batch_divisible(global_batch_size, mesh, rules, field="global batch_size")
  ids = _local_shard_ids(mesh, rules)
  if ids != list(range(ids[0], ids[-1] + 1)):
    raise ValueError(f"this process holds non-contiguous batch shards {ids}; lay the mesh out so "
                     "that the batch axes are outermost (mtrl_jax.parallel.make_mesh does)")
  per = global_batch_size // num_batch_shards(mesh, rules)
  return slice(ids[0] * per, (ids[-1] + 1) * per)


def shard_batch(batch, mesh: Mesh, rules: Rules):
  """Host arrays -> global jax.Arrays split over the batch axes.

  One process: `batch` is the global batch. Several: `batch` holds only this
  process's rows (see `process_batch_rows`), and the global batch is their
  concatenation in process order.
  """
  multi = jax.process_count() > 1
  if multi:
    ids = _local_shard_ids(mesh, rules)
    scale = num_batch_shards(mesh, rules) // len(ids)

  def put(path, x):
    x = np.asarray(x)
    name = path_str(path) or "batch"
    if x.ndim < 1:
      raise ValueError(f"batch field {name} is a scalar; every batch field needs a leading batch dimension")
    sharding = batch_sharding(mesh, rules, x.ndim)
    if not multi:
      check_batch_divisible(x.shape[0], mesh, rules, field=f"batch field {name} rows")
      return jax.device_put(x, sharding)
    global_shape = (x.shape[0] * scale,) + x.shape[1:]
    check_batch_divisible(global_shape[0], mesh, rules, field=f"batch field {name} global rows")
    return jax.make_array_from_process_local_data(sharding, x, global_shape)

  return jax.tree_util.tree_map_with_path(put, batch)


def put_global_batch(batch, mesh: Mesh, rules: Rules):
  """Like `shard_batch`, for a batch every process holds whole (the same global rows everywhere).

  Each process hands the runtime only the rows its own devices hold (on one
  process: all of them), so nothing is sent between hosts. This is how the
  learner feeds a batch that every host packed identically from the
  sessions all hosts played.
  """
  if jax.process_count() == 1:
    return shard_batch(batch, mesh, rules)

  def put(path, x):
    x = np.asarray(x)
    name = path_str(path) or "batch"
    if x.ndim < 1:
      raise ValueError(f"batch field {name} is a scalar; every batch field needs a leading batch dimension")
    check_batch_divisible(x.shape[0], mesh, rules, field=f"batch field {name} rows")
    return jax.make_array_from_callback(x.shape, batch_sharding(mesh, rules, x.ndim), lambda idx: x[idx])

  return jax.tree_util.tree_map_with_path(put, batch)
