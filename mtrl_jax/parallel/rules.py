"""Logical-axis rules: which mesh axes each logical name of the model lands on.

Rules are plain data, a tuple of `(logical_name, mesh_axes)` pairs where
`mesh_axes` is None (replicated), one mesh axis name, or a tuple of them. The
model code names only logical axes; a config picks a preset by name and may
override single entries.

Every logical name the model uses must have a rule: flax's
`from_sharding_rules` passes an unknown name through unchanged, where it would
then be read as a *mesh* axis name and fail far from its cause.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Union

from jax.sharding import PartitionSpec

from mtrl_jax.parallel.config_access import read_field

MeshAxes = Union[None, str, tuple]
Rules = tuple  # tuple[tuple[str, MeshAxes], ...]

# The names in model code (mtrl_jax/models/layers.py, transformer.py, value.py).
# A new logical name in the model needs a line here and a rule in each preset.
LOGICAL_AXES = ("batch", "length", "embed", "mlp", "heads", "kv_heads", "head_dim", "vocab", "layers")

DEFAULT_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("vocab", "tensor"),
    # The stacked-blocks axis of a scanned model (ModelConfig.scan_layers): the
    # scan reads one layer at a time, so it stays whole on every device.
    ("layers", None),
)

# Pure FSDP: the batch is split over every data-like axis, each weight over
# `fsdp` along its model dimension, and nothing is tensor-parallel.
FSDP_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("mlp", None),
    ("heads", None),
    ("kv_heads", None),
    ("head_dim", None),
    ("vocab", None),
    ("layers", None),
)

PRESETS: dict[str, Rules] = {"default": DEFAULT_RULES, "fsdp": FSDP_RULES}


def normalize_axes(axes, *, where: str = "rule") -> MeshAxes:
  """None, one axis name, or a tuple of two or more names (a 1-tuple becomes its name)."""
  if axes is None:
    return None
  if isinstance(axes, str):
    return axes
  if isinstance(axes, Sequence) and all(isinstance(a, str) for a in axes):
    axes = tuple(axes)
    if len(set(axes)) != len(axes):
      raise ValueError(f"{where}: mesh axes {axes} repeat an axis")
    if not axes:
      return None
    return axes[0] if len(axes) == 1 else axes
  raise ValueError(f"{where}: mesh axes must be None, a mesh axis name or a tuple of names; got {axes!r}")


def axes_tuple(axes: MeshAxes) -> tuple:
  """The mesh axes of a rule as a tuple (empty when replicated)."""
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def validate_rules(rules, mesh=None, *, field: str = "config.mesh.rules") -> Rules:
  """Checks rules and returns them normalised.

  Every name of LOGICAL_AXES must be mapped exactly once; with a mesh, every
  mesh axis named must exist in it.
  """
  out, seen = [], set()
  for i, pair in enumerate(rules):
    if not (isinstance(pair, Sequence) and len(pair) == 2 and isinstance(pair[0], str)):
      raise ValueError(f"{field}[{i}] must be a (logical_name, mesh_axes) pair; got {pair!r}")
    name, axes = pair
    if name in seen:
      raise ValueError(f"{field}: logical axis {name!r} is mapped twice")
    seen.add(name)
    axes = normalize_axes(axes, where=f"{field} {name!r}")
    if mesh is not None:
      for a in axes_tuple(axes):
        if a not in mesh.axis_names:
          raise ValueError(f"{field}: logical axis {name!r} maps to mesh axis {a!r}, "
                           f"which the mesh lacks (mesh axes: {tuple(mesh.axis_names)})")
    out.append((name, axes))
  missing = [n for n in LOGICAL_AXES if n not in seen]
  if missing:
    raise ValueError(f"{field}: no rule for logical axis/axes {missing}; map each to None to replicate it")
  return tuple(out)


def get_rules(preset: str = "default", overrides=None, *, field: str = "config.mesh") -> Rules:
  """A preset by name with single entries replaced.

  overrides: a mapping or a sequence of (logical_name, mesh_axes) pairs; each
  name must be a known logical axis (a typo would otherwise be ignored).
  """
  if preset not in PRESETS:
    raise ValueError(f"{field}.rules={preset!r} is not a preset; choose one of {sorted(PRESETS)}")
  rules = dict(PRESETS[preset])
  if overrides:
    pairs = overrides.items() if isinstance(overrides, Mapping) or hasattr(overrides, "items") else overrides
    for i, pair in enumerate(pairs):
      if not (isinstance(pair, Sequence) and len(pair) == 2):
        raise ValueError(f"{field}.rule_overrides[{i}] must be a (logical_name, mesh_axes) pair; got {pair!r}")
      name, axes = pair
      if name not in rules:
        raise ValueError(f"{field}.rule_overrides names logical axis {name!r}, which no model uses; "
                         f"known: {sorted(rules)}")
      rules[name] = normalize_axes(axes, where=f"{field}.rule_overrides {name!r}")
  return validate_rules(tuple(rules.items()), field=f"{field}.rules")


def rules_from_config(mesh_cfg, *, field: str = "config.mesh") -> Rules:
  """Rules from a config section with `rules` (a preset name) and optional `rule_overrides`."""
  return get_rules(read_field(mesh_cfg, "rules", "default"), read_field(mesh_cfg, "rule_overrides"),
                   field=field)


def mesh_axes(rules: Rules, logical_name: str) -> tuple:
  """The mesh axes (a tuple, empty if replicated) that one logical name maps to."""
  table = dict(rules)
  if logical_name not in table:
    raise ValueError(f"logical axis {logical_name!r} has no rule; rules cover {sorted(table)}")
  return axes_tuple(table[logical_name])


def activation_rules(rules: Rules) -> Rules:
  """Rules for activations: the batch axes are taken away from every other name.

  A weight's `embed` dimension may live on `fsdp` while activations are split
  over `fsdp` along the batch; one PartitionSpec cannot use an axis twice, so
  in activations [batch, length, embed] the batch keeps `fsdp` and `embed` is
  replicated, which is what FSDP means (weights are gathered, not activations).
  """
  taken = set(mesh_axes(rules, "batch"))
  out = []
  for name, axes in rules:
    if name != "batch":
      axes = normalize_axes(tuple(a for a in axes_tuple(axes) if a not in taken))
    out.append((name, axes))
  return tuple(out)


def logical_to_spec(names: Sequence, rules: Rules, *, what: str = "array") -> PartitionSpec:
  """PartitionSpec of an array annotated with logical `names` (None = replicated dim)."""
  table = dict(rules)
  spec = []
  for n in names:
    if n is None:
      spec.append(None)
      continue
    if n not in table:
      raise ValueError(f"{what}: logical axis {n!r} has no rule (rules cover {sorted(table)}); "
                       "without one flax would read it as a mesh axis name")
    spec.append(table[n])
  return PartitionSpec(*spec)
