"""A jitted, donated, explicitly sharded update step over split model state.

Any loss works: `loss_fn(params, batch) -> (loss, metrics)` where `params` is
the nnx.Param state of a model (the caller merges it with its graphdef) and
`metrics` a dict of scalars. The optimizer is plain optax, so the optimizer
state is an ordinary pytree whose shardings follow the parameters'.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mtrl_jax.parallel.batch import batch_axes
from mtrl_jax.parallel.rules import Rules, activation_rules, normalize_axes, validate_rules

LossFn = Callable[[Any, Any], tuple]


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


@contextlib.contextmanager
def sharding_context(mesh: Mesh, rules: Rules):
  """Mesh + activation rules in force while model code is traced.

  `shard()` in the model reads both at trace time; without them activations
  get no constraints and XLA guesses the layout.
  """
  with jax.set_mesh(mesh), nnx.logical_axis_rules(activation_rules(rules)):
    yield


@dataclasses.dataclass(frozen=True)
class ShardedFn:
  """A jitted function that is always traced inside its mesh/rules context."""
  jitted: Any
  mesh: Mesh
  rules: Rules

  def __call__(self, *args):
    with sharding_context(self.mesh, self.rules):
      return self.jitted(*args)

  def lower(self, *args):
    """For inspecting the compiled program (memory, HLO) without running it."""
    with sharding_context(self.mesh, self.rules):
      return self.jitted.lower(*args)


def _batch_in_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
  # A spec naming only the leading dim is a valid prefix for leaves of any
  # rank, so one sharding covers every [B, ...] field of the batch pytree.
  return NamedSharding(mesh, PartitionSpec(normalize_axes(batch_axes(mesh, rules))))


def opt_state_shardings(optimizer: optax.GradientTransformation, params, param_shardings, mesh: Mesh):
  """Shardings for `optimizer.init(params)`: moment trees follow the params, the rest is replicated.

  An optimizer-state leaf takes a parameter's sharding when its tree path ends
  with that parameter's path and the shapes agree (how optax nests per-param
  trees: `mu/<param path>`); counters and scalars are replicated.
  """
  by_path = {}
  flat_p = jax.tree_util.tree_flatten_with_path(params)[0]
  flat_s = jax.tree.leaves(param_shardings)
  for (path, p), s in zip(flat_p, flat_s, strict=True):
    by_path[tuple(path)] = (tuple(np.shape(p)), s)
  abstract = jax.eval_shape(optimizer.init, params)

  def one(path, leaf):
    path = tuple(path)
    for start in range(len(path)):
      hit = by_path.get(path[start:])
      if hit is not None and hit[0] == tuple(leaf.shape):
        return hit[1]
    return replicated(mesh)

  return jax.tree_util.tree_map_with_path(one, abstract)


def init_opt_state(optimizer: optax.GradientTransformation, params, opt_shardings):
  """The optimizer state, created sharded (never whole on one device)."""
  return jax.jit(optimizer.init, out_shardings=opt_shardings)(params)


def make_grad_fn(loss_fn: LossFn, *, mesh: Mesh, rules: Rules, param_shardings) -> ShardedFn:
  """fn(params, batch) -> (loss, metrics, grads); grads sharded like the params.

  The building block for gradient accumulation, and what tests compare with a
  single-device gradient.
  """
  rules = validate_rules(rules, mesh)

  def grads(params, batch):
    (loss, metrics), g = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
    return loss, metrics, g

  rep = replicated(mesh)
  jitted = jax.jit(grads, in_shardings=(param_shardings, _batch_in_sharding(mesh, rules)),
                   out_shardings=(rep, rep, param_shardings))
  return ShardedFn(jitted, mesh, rules)


def split_trainable(state, trainable):
  """(what an optimiser moves, what stays frozen) of an nnx.State; `trainable` (an nnx
  filter) None = all of it, and the frozen part is None."""
  if trainable is None or state is None:
    return state, None
  return nnx.split_state(state, trainable, ...)


def join_trainable(train, frozen):
  """The inverse of `split_trainable`."""
  return train if frozen is None else nnx.merge_state(train, frozen)


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, *, mesh: Mesh, rules: Rules,
                    param_shardings, opt_shardings, donate: bool = True,
                    frozen_shardings=None) -> ShardedFn:
  """step(params, opt_state, batch) -> (params, opt_state, metrics), jitted with explicit shardings.

  params and opt_state are donated: their old buffers are reused for the new
  values, so the caller must drop its references to the inputs. metrics adds
  `loss` and `grad_norm` to the loss's own metrics; all are replicated scalars
  left on device (fetch them only on log steps).

  With `frozen_shardings` the step is step(params, opt_state, batch, frozen):
  `params` is the trained part of the model's state (e.g. its LoRA adapters,
  see `split_trainable`) and `frozen` the rest, which the loss sees but which
  is neither differentiated nor donated nor returned.
  """
  rules = validate_rules(rules, mesh)

  def step(params, opt_state, batch, frozen=None):
    def loss_of(params, batch):
      return loss_fn(join_trainable(params, frozen), batch)

    (loss, metrics), grads = jax.value_and_grad(loss_of, has_aux=True)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, {**metrics, "loss": loss, "grad_norm": optax.global_norm(grads)}

  in_sh = (param_shardings, opt_shardings, _batch_in_sharding(mesh, rules))
  if frozen_shardings is not None:
    in_sh = in_sh + (frozen_shardings,)
  jitted = jax.jit(step, in_shardings=in_sh,
                   out_shardings=(param_shardings, opt_shardings, replicated(mesh)),
                   donate_argnums=(0, 1) if donate else ())
  return ShardedFn(jitted, mesh, rules)


def fetch_replicated(tree):
  """Host copies of replicated arrays (metrics); works on every host of a multi-host run."""
  def one(x):
    if isinstance(x, jax.Array):
      if not x.is_fully_replicated and not x.is_fully_addressable:
        raise ValueError(f"array of shape {x.shape} is split across hosts; only replicated values can be fetched")
      return np.asarray(x.addressable_data(0)) if x.is_fully_replicated else np.asarray(x)
    return x
  return jax.tree.map(one, tree)
