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
