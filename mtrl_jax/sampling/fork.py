"""Row copies of a `DecodeState`: the device half of forking a live session.

A session's whole decoding state is its KV-cache row (keys, values, length)
plus the logits after its last cached token. Copying those into another row
gives a child that continues exactly as the parent would: same cached
prefix, same positions, same next-token distribution. Nothing is recomputed,
so the shared prefix is prefilled (and paid for) once.

Keys/values are `[..., B, KV, S, hd]`: the batch axis is found from the end,
so a layer-stacked cache (`[L, B, KV, S, hd]`) is handled the same way.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from mtrl_jax.models.transformer import KVCache
from mtrl_jax.sampling.records import DecodeState

_BATCH_FROM_END = 4  # keys/values end in [B, KV, S, hd]


def _kv_map(fn, kv):
  return jax.tree.map(lambda x: fn(x, x.ndim - _BATCH_FROM_END), kv)


def gather_rows(state: DecodeState, src_b: jax.Array) -> DecodeState:
  """A state whose row i is a copy of `state` row src_b[i] (batch = len(src_b))."""
  take = lambda x, axis: jnp.take(x, src_b, axis=axis)
  cache = state.cache
  return DecodeState(KVCache(_kv_map(take, cache.k), _kv_map(take, cache.v), cache.length_b[src_b]),
                     state.last_logits_bv[src_b], state.capacity)


def copy_rows(state: DecodeState, src_n: jax.Array, dst_n: jax.Array) -> DecodeState:
  """The same batch with row dst_n[i] overwritten by row src_n[i] (all read before any write)."""
  def put(x, axis):
    rows = jnp.take(x, src_n, axis=axis)
    idx = (slice(None),) * axis + (dst_n,)
    return x.at[idx].set(rows)
  cache = state.cache
  return DecodeState(KVCache(_kv_map(put, cache.k), _kv_map(put, cache.v),
                             cache.length_b.at[dst_n].set(cache.length_b[src_n])),
                     state.last_logits_bv.at[dst_n].set(state.last_logits_bv[src_n]), state.capacity)


def move_rows(src: DecodeState, src_n: jax.Array, dst: DecodeState, dst_n: jax.Array) -> DecodeState:
  """`dst` with its row dst_n[i] overwritten by row src_n[i] of another state.

  The continuous scheduler parks the cache row of a session waiting on its
  env in a store and brings it back later (rollout/continuous.py). Both
  states must have the same layout and allocated slots.
  """
  def put(s, d):
    axis = d.ndim - _BATCH_FROM_END
    rows = jnp.take(s, src_n, axis=axis)
    return d.at[(slice(None),) * axis + (dst_n,)].set(rows)
  sc, dc = src.cache, dst.cache
  cache = KVCache(jax.tree.map(put, sc.k, dc.k), jax.tree.map(put, sc.v, dc.v),
                  dc.length_b.at[dst_n].set(sc.length_b[src_n]))
  return DecodeState(cache, dst.last_logits_bv.at[dst_n].set(src.last_logits_bv[src_n]), dst.capacity)


def clear_rows(state: DecodeState, rows_n: jax.Array) -> DecodeState:
  """The same state with rows rows_n emptied (length 0): a new session starts there.

  The old keys and values stay in the slots; attention never reads a slot at
  or past a row's length, and appends overwrite them.
  """
  cache = state.cache._replace(length_b=state.cache.length_b.at[rows_n].set(0))
  return DecodeState(cache, state.last_logits_bv.at[rows_n].set(0.0), state.capacity)


def state_shardings(state: DecodeState, mesh) -> DecodeState:
  """Shardings of a state on `mesh`: rows split over its first axis when the
  batch divides it (each device decodes its own rows), else replicated."""
  from jax.sharding import NamedSharding, PartitionSpec
  axis = mesh.axis_names[0]
  split = state.last_logits_bv.shape[0] % mesh.shape[axis] == 0

  def spec(x, batch_axis):
    parts = [None] * x.ndim
    if split:
      parts[batch_axis] = axis
    return NamedSharding(mesh, PartitionSpec(*parts))

  cache = state.cache
  return DecodeState(KVCache(_kv_map(spec, cache.k), _kv_map(spec, cache.v), spec(cache.length_b, 0)),
                     spec(state.last_logits_bv, 0), NamedSharding(mesh, PartitionSpec()))
