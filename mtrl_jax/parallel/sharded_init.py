"""Model state created directly in its sharded layout, and the shardings of any state.

The parameters never exist whole on one device: the model is traced abstractly
(`nnx.eval_shape`), its shardings are read from the logical annotations, and a
jitted init writes each shard where it belongs.

A weight dimension that does not divide the product of its mesh axes (e.g. 4
heads over tensor=8) is replicated along that dimension with a logged warning,
since the math is unchanged and only memory grows; `strict=True` raises
instead, naming the parameter, the logical axis and the mesh axes.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Hashable

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mtrl_jax.compile.programs import Program, Tree, shared
from mtrl_jax.parallel.rules import Rules, axes_tuple, validate_rules
from mtrl_jax.parallel.tree_paths import path_str

log = logging.getLogger(__name__)
_warned: set = set()


def param_spec(name: str, shape: tuple, logical: tuple | None, mesh: Mesh, rules: Rules, *,
               strict: bool = False) -> PartitionSpec:
  """PartitionSpec of one array from its logical names; checks rules, axes and divisibility."""
  if not logical:
    return PartitionSpec()
  if len(logical) != len(shape):
    raise ValueError(f"parameter {name}: {len(logical)} logical names {logical} for shape {shape}")
  table = dict(rules)
  spec, used = [], {}
  for dim, (size, lname) in enumerate(zip(shape, logical)):
    if lname is None:
      spec.append(None)
      continue
    if lname not in table:
      raise ValueError(f"parameter {name}: logical axis {lname!r} has no rule in config.mesh.rules "
                       f"(rules cover {sorted(table)}); map it to None to replicate it")
    axes = axes_tuple(table[lname])
    for a in axes:
      if a not in mesh.axis_names:
        raise ValueError(f"parameter {name}: logical axis {lname!r} maps to mesh axis {a!r}, "
                         f"which the mesh lacks (mesh axes: {tuple(mesh.axis_names)})")
      if a in used:
        raise ValueError(f"parameter {name}: mesh axis {a!r} is used by both logical axes "
                         f"{used[a]!r} and {lname!r}; fix config.mesh.rules")
      used[a] = lname
    parts = math.prod(mesh.shape[a] for a in axes)
    if parts > 1 and size % parts:
      msg = (f"parameter {name}: dimension {dim} ({lname!r}, size {size}) is not divisible by "
             f"mesh axes {axes} (size {parts})")
      if strict:
        raise ValueError(msg + "; change config.mesh.shape or config.mesh.rule_overrides")
      if msg not in _warned:  # state_shardings runs several times per model; say it once
        _warned.add(msg)
        log.warning("%s; replicating it along that dimension", msg)
      spec.append(None)
      continue
    spec.append(table[lname])
  return PartitionSpec(*spec)


def state_shardings(state, mesh: Mesh, rules: Rules, *, strict: bool = False):
  """A tree like `state` (an nnx.State, possibly abstract) holding a NamedSharding per array.

  Variables keep their wrapper so the tree matches the state's own structure,
  as `jax.jit` in/out shardings require; unannotated arrays are replicated.
  """
  rules = validate_rules(rules, mesh)

  def one(path, x):
    if isinstance(x, nnx.Variable):
      value = x.get_value()
      logical = x.get_metadata().get("out_sharding")
      spec = param_spec(path_str(path), tuple(value.shape), logical, mesh, rules, strict=strict)
      return x.replace(NamedSharding(mesh, spec))
    return NamedSharding(mesh, PartitionSpec())

  return jax.tree_util.tree_map_with_path(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def abstract_model(model_factory: Callable[[], nnx.Module], mesh: Mesh, rules: Rules):
  """(graphdef, abstract state) of the factory's module, traced under the mesh and rules."""
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    abstract = nnx.eval_shape(model_factory)
  return nnx.split(abstract)


@dataclasses.dataclass(frozen=True)
class ModelOf:
  """A model factory that is a value: `cls(cfg, rngs=rngs)`. Equal when `cls` and `cfg` are, so a
  seeded `create_sharded` of one is shared by every run of the process (another seed compiles nothing)."""
  cls: type
  cfg: Hashable

  def __call__(self, rngs: nnx.Rngs) -> nnx.Module:
    return self.cls(self.cfg, rngs=rngs)


@dataclasses.dataclass(frozen=True)
class SeededInit(Program):
  """The jitted init of `factory(nnx.Rngs(key))` into `shardings`; the key is its argument.

  `rules`: the logical axis rules the caller traces it under (they shape the program too).
  """
  factory: ModelOf
  shardings: Tree
  rules: tuple

  def build(self):
    return _seeded_init(self.factory, self.shardings.value)


def _seeded_init(factory, shardings):
  def init_from(key):
    return nnx.split(factory(nnx.Rngs(key)))[1]
  return jax.jit(init_from, out_shardings=shardings)


def create_sharded(model_factory: Callable[..., nnx.Module], mesh: Mesh, rules: Rules, *,
                   strict: bool = False, seed: int | None = None) -> nnx.Module:
  """Builds `model_factory()` with every variable already sharded over `mesh`.

  The factory must be deterministic (it runs twice: abstractly, then jitted)
  and take its randomness from an `nnx.Rngs` it creates itself. Values equal
  an unsharded `model_factory()` (JAX's partitionable threefry makes random
  draws independent of the layout).

  With `seed`, the factory takes the `nnx.Rngs` instead (`model_factory(rngs)`,
  rngs = nnx.Rngs(seed): the same values), and the seed enters the jitted init
  as an argument, not a constant. A `ModelOf` factory then shares its compiled
  init with every call of this process with an equal factory and layout
  (mtrl_jax/compile/programs.py): runs that differ in their seed compile it once.
  """
  if seed is not None:
    seeded, model_factory = model_factory, (lambda: seeded(nnx.Rngs(seed)))
  rules = validate_rules(rules, mesh)
  try:
    graphdef, abs_state = abstract_model(model_factory, mesh, rules)
  except Exception:
    # Variables shard eagerly while traced under the mesh, so a bad rule fails
    # inside flax with no parameter name; trace again without the mesh to
    # report it by name, else re-raise the original error.
    state_shardings(nnx.split(nnx.eval_shape(model_factory))[1], mesh, rules, strict=strict)
    raise
  shardings = state_shardings(abs_state, mesh, rules, strict=strict)

  if seed is None:
    def init():
      return nnx.split(model_factory())[1]

    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
      state = jax.jit(init, out_shardings=shardings)()
    return nnx.merge(graphdef, state)

  jitted = (shared(SeededInit(seeded, Tree(shardings), tuple(rules))) if isinstance(seeded, ModelOf)
            else _seeded_init(seeded, shardings))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    state = jitted(jax.random.key(seed))
  return nnx.merge(graphdef, state)


def create_sharded_part(model_factory: Callable[[], nnx.Module], part, mesh: Mesh, rules: Rules, *,
                        strict: bool = False):
  """(graphdef of the whole module, the state that the nnx filter `part` selects), created sharded.

  Only the selected part is materialised (the jitted init returns nothing
  else, so XLA drops the rest), e.g. a shared-trunk critic's adapters and
  head without a second copy of the trunk it borrows.
  """
  rules = validate_rules(rules, mesh)
  graphdef, abs_state = abstract_model(model_factory, mesh, rules)
  shardings = state_shardings(nnx.split_state(abs_state, part, ...)[0], mesh, rules, strict=strict)

  def init():
    return nnx.split_state(nnx.split(model_factory())[1], part, ...)[0]

  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    return graphdef, jax.jit(init, out_shardings=shardings)()
