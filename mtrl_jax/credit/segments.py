"""Segment bookkeeping shared by the estimators: id ranks, episodes, turns.

Everything here is fixed-shape: the number of segments is always a static
bound (B episodes, B * K episode-turns), so it jits and vmaps. Ids are
remapped with a sort-based dense rank, so callers may use any non-negative
(or negative) int32 ids.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp


def dense_rank(ids_b: jax.Array) -> jax.Array:
  """Maps ids to 0..(num_unique - 1), preserving their order. int32[B]."""
  ids_b = jnp.asarray(ids_b)
  n = ids_b.shape[0]
  order = jnp.argsort(ids_b, stable=True)
  srt = ids_b[order]
  is_new = jnp.concatenate(
      [jnp.zeros((1,), jnp.int32), (srt[1:] != srt[:-1]).astype(jnp.int32)])
  return jnp.zeros((n,), jnp.int32).at[order].set(jnp.cumsum(is_new))


def segment_normalize(x: jax.Array,
                      seg: jax.Array,
                      valid: jax.Array,
                      num_segments: int,
                      eps: float = 1e-6,
                      scale_by_std: bool = True,
                      ddof: int = 0) -> jax.Array:
  """(x - mean_seg) / (std_seg + eps) over the valid entries of each segment.

  Invalid entries do not enter the statistics and come out as exactly 0.
  The variance is the two-pass one (mean of squared deviations), divided by
  max(count - ddof, 1).

  A segment whose valid entries are all equal normalises to exactly 0, for
  any float32 value: each segment is first shifted by its own minimum, so its
  entries become exact zeros. Without the shift, the float32 mean of, say,
  eight 0.95s is one rounding step off, and that tiny deviation divided by
  (std + eps), with std just as tiny, gives every entry a sizeable advantage.
  The shift also makes the statistics more accurate in general (it cancels
  the large common part of the values before summing).
  """
  w = valid.astype(jnp.float32)
  big = jnp.asarray(jnp.inf, x.dtype)
  lo = jax.ops.segment_min(jnp.where(valid, x, big), seg, num_segments=num_segments)
  lo = jnp.where(jnp.isfinite(lo), lo, 0.0)  # empty segments
  x = jnp.where(valid, x - lo[seg], 0.0)
  cnt = jax.ops.segment_sum(w, seg, num_segments=num_segments)
  mean = jax.ops.segment_sum(w * x, seg, num_segments=num_segments)
  mean = mean / jnp.maximum(cnt, 1.0)
  dev = x - mean[seg]
  out = dev
  if scale_by_std:
    var = jax.ops.segment_sum(w * dev * dev, seg, num_segments=num_segments)
    var = var / jnp.maximum(cnt - ddof, 1.0)
    scale = jnp.sqrt(var)[seg] + eps
    # A constant segment has dev == 0; keep it 0 even with eps = 0.
    out = jnp.where(scale > 0, dev / jnp.where(scale > 0, scale, 1.0), 0.0)
  return jnp.where(valid, out, 0.0)


class EpisodeTable(NamedTuple):
  """Episodes as dense slots 0..B-1 (a slot past the last episode is empty).

  ep_b: int32[B] slot of each row's episode.
  first_e: int32[B] lowest row index of each episode (0 for empty slots).
  valid_e: bool[B] the slot holds an episode with at least one action token.
  """

  ep_b: jax.Array
  first_e: jax.Array
  valid_e: jax.Array


def episode_table(episode_id_b: jax.Array, loss_mask_bt: jax.Array) -> EpisodeTable:
  b = episode_id_b.shape[0]
  ep_b = dense_rank(episode_id_b)
  rows = jnp.arange(b, dtype=jnp.int32)
  first_e = jax.ops.segment_min(rows, ep_b, num_segments=b)
  present_e = first_e < b
  has_action_b = jnp.any(loss_mask_bt > 0, axis=1).astype(jnp.int32)
  has_action_e = jax.ops.segment_max(has_action_b, ep_b, num_segments=b) > 0
  return EpisodeTable(
      ep_b=ep_b,
      first_e=jnp.where(present_e, first_e, 0),
      valid_e=present_e & has_action_e)


def per_episode(x_b: jax.Array, table: EpisodeTable) -> jax.Array:
  """Reads a per-row field once per episode (from its lowest-index row)."""
  return x_b[table.first_e]


class TurnTable(NamedTuple):
  """Per (episode, turn) quantities, shape [B, K] (episode slot, turn index).

  seg_bt: int32[B, T] flat (episode * K + turn) of each action token; B * K
    (a dropped segment) for non-action tokens and turns >= K.
  reward_ek: sum of action-token rewards of the turn.
  count_ek: number of action tokens in the turn.
  exists_ek: the turn has at least one action token.
  first_ek / last_ek: flat token index (row * T + t) of the turn's first /
    last action token (clipped into range where the turn does not exist).
  """

  seg_bt: jax.Array
  reward_ek: jax.Array
  count_ek: jax.Array
  exists_ek: jax.Array
  first_ek: jax.Array
  last_ek: jax.Array


def turn_table(reward_bt, loss_mask_bt, turn_idx_bt, ep_b, max_turns: int) -> TurnTable:
  b, t = reward_bt.shape
  k = max_turns
  m = (loss_mask_bt > 0) & (turn_idx_bt >= 0) & (turn_idx_bt < k)
  seg = jnp.where(m, ep_b[:, None] * k + turn_idx_bt, b * k).reshape(-1)
  n = b * k + 1  # the last segment collects everything that is not counted
  # Equivalent mutants: without the dtype, arange's default int is int32 too.
  flat = jnp.arange(b * t, dtype=jnp.int32)  # pragma: no mutate
  mf = m.reshape(-1)
  # Equivalent mutants: the fill value lands only in the dropped segment b*k.
  r = jnp.where(mf, reward_bt.reshape(-1), 0.0)  # pragma: no mutate
  reward_ek = jax.ops.segment_sum(r, seg, num_segments=n)[:-1].reshape(b, k)
  count_ek = jax.ops.segment_sum(mf.astype(jnp.int32), seg, num_segments=n)
  count_ek = count_ek[:-1].reshape(b, k)
  first = jax.ops.segment_min(jnp.where(mf, flat, b * t), seg, num_segments=n)
  last = jax.ops.segment_max(jnp.where(mf, flat, -1), seg, num_segments=n)
  return TurnTable(
      seg_bt=seg.reshape(b, t),
      reward_ek=reward_ek,
      count_ek=count_ek,
      exists_ek=count_ek > 0,
      first_ek=jnp.clip(first[:-1], 0, b * t - 1).reshape(b, k),
      last_ek=jnp.clip(last[:-1], 0, b * t - 1).reshape(b, k))


def gather_turns(x_ek: jax.Array, table: TurnTable) -> jax.Array:
  """Broadcasts a per-(episode, turn) value to its action tokens; 0 elsewhere."""
  flat = jnp.concatenate([x_ek.reshape(-1), jnp.zeros((1,), x_ek.dtype)])
  return flat[table.seg_bt]


def reverse_cumcount(mask_bt: jax.Array) -> jax.Array:
  """Number of mask-1 tokens strictly after each position of its row."""
  m = mask_bt.astype(jnp.int32)
  return jnp.flip(jnp.cumsum(jnp.flip(m, axis=1), axis=1), axis=1) - m
