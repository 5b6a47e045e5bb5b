"""The device mesh from a config: a shape with at most one -1, Auto axes.

Devices are laid out so that the first axis (`data`) is the outermost: on
several hosts each host holds whole `data` slices, and only the data-parallel
gradient reduction crosses the slow host-to-host network.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from mtrl_jax.parallel.config_access import read_field
from mtrl_jax.parallel.rules import rules_from_config, validate_rules

AXIS_NAMES = ("data", "fsdp", "tensor")

log = logging.getLogger(__name__)


def resolve_mesh_shape(mesh_shape: Sequence[int], n_devices: int, *,
                       field: str = "config.mesh.shape") -> tuple:
  """Replaces one -1 by what is left of `n_devices`; checks the product fits exactly."""
  shape = tuple(mesh_shape)
  if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in shape):
    raise ValueError(f"{field}={shape}: entries must be integers")
  shape = tuple(int(s) for s in shape)
  if shape.count(-1) > 1:
    raise ValueError(f"{field}={shape}: at most one entry may be -1 (\"the rest\")")
  bad = [s for s in shape if s == 0 or s < -1]
  if bad:
    raise ValueError(f"{field}={shape}: entries must be positive or a single -1; got {bad}")
  fixed = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if n_devices % fixed:
      raise ValueError(f"{field}={shape}: the fixed axes need a multiple of {fixed} devices, "
                       f"but {n_devices} are available")
    shape = tuple(n_devices // fixed if s == -1 else s for s in shape)
  elif fixed != n_devices:
    raise ValueError(f"{field}={shape} needs {fixed} devices but {n_devices} are available; "
                     "use -1 on one axis to take the rest")
  return shape


def _plain_layout(shape: tuple, devices: Sequence) -> np.ndarray:
  # Row-major over devices ordered by host: the leading axis changes slowest,
  # so consecutive `data` indices fill one host before moving to the next.
  ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
  return np.asarray(ordered, dtype=object).reshape(shape)


def arrange_devices(shape: tuple, devices: Sequence) -> np.ndarray:
  """A device array of `shape` with the leading (data) axis spanning hosts/slices."""
  platform = devices[0].platform
  if platform == "cpu":
    return _plain_layout(shape, devices)
  slices = {getattr(d, "slice_index", 0) for d in devices}
  processes = {d.process_index for d in devices}
  granules, by_process = (len(slices), False) if len(slices) > 1 else (len(processes), True)
  if granules > 1 and (platform != "tpu" or len(slices) > 1) and shape[0] % granules:
    # E.g. pure FSDP over every device of two hosts: correct in host order,
    # but the axes other than data now cross the network too.
    log.warning("config.mesh.shape=%s: data axis %d is not a multiple of the %d hosts/slices, so "
                "other axes span hosts; using host order", shape, shape[0], granules)
    return _plain_layout(shape, devices)
  try:
    if granules > 1 and (platform != "tpu" or len(slices) > 1):
      # Several TPU slices, or several GPU hosts: the data axis crosses the
      # network (DCN), the other axes stay on the fast interconnect.
      ici = (shape[0] // granules,) + tuple(shape[1:])
      dcn = (granules,) + (1,) * (len(shape) - 1)
      return mesh_utils.create_hybrid_device_mesh(
          ici, dcn, devices, process_is_granule=by_process, allow_split_physical_axes=True)
    return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  except (ValueError, NotImplementedError, AssertionError) as e:
    # Topology helpers reject some shapes (e.g. odd GPU counts); a plain layout
    # is still correct, only possibly slower.
    log.warning("mesh_utils could not lay out %s over %d %s devices (%s); using host order",
                shape, len(devices), platform, e)
    return _plain_layout(shape, devices)


def make_mesh(mesh_shape: Sequence[int], axis_names: Sequence[str] = AXIS_NAMES,
              devices: Sequence | None = None, *, field: str = "config.mesh.shape") -> Mesh:
  """A Mesh with Auto axis types over all (global) devices or the given ones.

  One entry of `mesh_shape` may be -1, meaning the devices left over by the
  others. Auto axes let XLA insert the collectives; the Explicit default of
  `jax.make_mesh` would instead raise on any sharding mismatch.
  """
  axis_names = tuple(axis_names)
  if len(tuple(mesh_shape)) != len(axis_names):
    raise ValueError(f"{field}={tuple(mesh_shape)} has {len(tuple(mesh_shape))} entries but the mesh "
                     f"has {len(axis_names)} axes {axis_names}")
  if len(set(axis_names)) != len(axis_names):
    raise ValueError(f"mesh axis names {axis_names} repeat a name")
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(mesh_shape, len(devices), field=field)
  grid = arrange_devices(shape, devices)
  return Mesh(grid, axis_names, axis_types=(AxisType.Auto,) * len(axis_names))


def mesh_from_config(mesh_cfg, devices: Sequence | None = None) -> Mesh:
  """The mesh of a `config.mesh` section (`shape`, optional `axis_names`)."""
  shape = read_field(mesh_cfg, "shape")
  if shape is None:
    raise ValueError("config.mesh.shape is missing; e.g. (-1, 1, 1) for pure data parallelism")
  return make_mesh(shape, read_field(mesh_cfg, "axis_names", AXIS_NAMES), devices)


class MeshSetup(NamedTuple):
  """What a `config.mesh` section decides: the mesh, the rules, and the divisibility policy."""
  mesh: Mesh
  rules: tuple
  strict: bool


def setup_from_config(mesh_cfg, devices: Sequence | None = None) -> MeshSetup:
  """Mesh, validated rules and `strict_divisibility` from one `config.mesh` section."""
  mesh = mesh_from_config(mesh_cfg, devices)
  rules = validate_rules(rules_from_config(mesh_cfg), mesh)
  return MeshSetup(mesh, rules, bool(read_field(mesh_cfg, "strict_divisibility", False)))


def default_mesh_config():
  """The `config.mesh` section: shape, axis names, rules preset and overrides.

  rule_overrides: (logical_name, mesh_axes) pairs replacing entries of the
  preset, e.g. (("vocab", None),). strict_divisibility: raise, instead of
  replicating with a warning, when a weight dimension does not divide its axes.
  """
  import ml_collections
  return ml_collections.ConfigDict(dict(
      shape=(-1, 1, 1), axis_names=AXIS_NAMES, rules="default", rule_overrides=(),
      strict_divisibility=False))
