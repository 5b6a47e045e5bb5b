"""The two parameter layouts of a decoder's blocks, and conversion between them.

Unrolled (`ModelConfig.scan_layers=False`): one module per block, so a
parameter's path is ('layers', i, 'attn', 'wq') and its value is one block's.
Scanned (`scan_layers=True`): one block module whose every parameter holds all
blocks stacked on a new leading axis, path ('layers', 'attn', 'wq'), logical
axis name "layers" in front of the block's own names.

The numbers are the same in both: layer i of the unrolled tree is row i of
the stacked one. The helpers work on flat states (`nnx.to_flat_state`) or
`nnx.State`s of any module that holds a decoder (a Transformer, a Critic's
trunk, a policy with a value head): they find the 'layers' key in each path.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

LAYERS = "layers"  # the attribute holding the blocks, and the stacked axis' logical name


def _stacked_var(vars_: Sequence[nnx.Variable]) -> nnx.Variable:
  """One Variable whose value stacks `vars_`' values on a new leading axis.

  Its logical names gain "layers" in front; inside a mesh + rules context it
  is placed sharded like a freshly created parameter would be.
  """
  first = vars_[0]
  meta = dict(first.get_metadata())
  names = meta.get("out_sharding")
  if names:
    meta["out_sharding"] = (LAYERS, *names)
  mesh = jax.sharding.get_abstract_mesh()
  meta["eager_sharding"] = bool(names) and mesh is not None and not mesh.empty
  value = jnp.stack([v.get_value() for v in vars_])
  return type(first)(value, **meta)


def _row_var(var: nnx.Variable, i: int) -> nnx.Variable:
  """Row i of a stacked Variable, with the "layers" logical name dropped."""
  meta = dict(var.get_metadata())
  names = meta.get("out_sharding")
  if names:
    if names[0] != LAYERS:
      raise ValueError(f"a stacked parameter's first logical axis must be {LAYERS!r}, got {names}")
    meta["out_sharding"] = tuple(names[1:])
  mesh = jax.sharding.get_abstract_mesh()
  meta["eager_sharding"] = bool(names) and mesh is not None and not mesh.empty
  return type(var)(var.get_value()[i], **meta)


def stack_modules(modules: Sequence[nnx.Module]) -> nnx.Module:
  """One module like modules[0] whose variables stack all of theirs (layer order kept)."""
  graphdef, _ = nnx.split(modules[0])
  flats = [list(nnx.to_flat_state(nnx.state(m))) for m in modules]
  paths = [p for p, _ in flats[0]]
  for k, flat in enumerate(flats[1:], 1):
    if [p for p, _ in flat] != paths:
      raise ValueError(f"module {k} has a different parameter tree than module 0; cannot stack")
  stacked = [(p, _stacked_var([flat[j][1] for flat in flats])) for j, p in enumerate(paths)]
  return nnx.merge(graphdef, nnx.from_flat_state(stacked))


def _layer_key(path: tuple) -> int | None:
  """Position of the 'layers' key in a path, or None when the path is no block's."""
  for j, key in enumerate(path):
    if key == LAYERS and j + 1 < len(path):
      return j
  return None


def is_scanned(flat) -> bool | None:
  """True/False for a stacked/unrolled flat state, None when it has no blocks."""
  for path, _ in flat:
    j = _layer_key(tuple(path))
    if j is not None:
      return not isinstance(path[j + 1], int)
  return None


def stack_flat(flat) -> list:
  """Unrolled flat state -> scanned flat state (a stacked one passes unchanged).

  Layers must be numbered 0..n-1 with the same parameters each; they are
  stacked in index order (not in the order the paths arrive).
  """
  out, groups, order = [], {}, []
  for path, var in flat:
    path = tuple(path)
    j = _layer_key(path)
    if j is None or not isinstance(path[j + 1], int):
      out.append((path, var))
      continue
    key = path[:j + 1] + path[j + 2:]
    if key not in groups:
      groups[key] = {}
      order.append(key)
      out.append((key, None))  # placeholder: keep the tree's order
    groups[key][path[j + 1]] = var
  n = None
  for key in order:
    idx = sorted(groups[key])
    if idx != list(range(len(idx))) or (n is not None and len(idx) != n):
      raise ValueError(f"parameter {'/'.join(map(str, key))}: layers {idx} are not 0..{(n or len(idx)) - 1}")
    n = len(idx)
  return [(p, _stacked_var([groups[p][i] for i in range(n)]) if v is None else v) for p, v in out]


def unstack_flat(flat) -> list:
  """Scanned flat state -> unrolled flat state (an unrolled one passes unchanged)."""
  out = []
  for path, var in flat:
    path = tuple(path)
    j = _layer_key(path)
    if j is None or isinstance(path[j + 1], int):
      out.append((path, var))
      continue
    for i in range(var.get_value().shape[0]):
      out.append((path[:j + 1] + (i,) + path[j + 1:], _row_var(var, i)))
  return out


def to_scanned(state: nnx.State) -> nnx.State:
  return nnx.from_flat_state(stack_flat(nnx.to_flat_state(state)))


def to_unrolled(state: nnx.State) -> nnx.State:
  return nnx.from_flat_state(unstack_flat(nnx.to_flat_state(state)))


def to_layout(state: nnx.State, scan_layers: bool) -> nnx.State:
  return to_scanned(state) if scan_layers else to_unrolled(state)

