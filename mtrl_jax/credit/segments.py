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
  # Equivalent mutants: an unstable sort only reorders equal ids, which get
  # the same rank anyway.
  order = jnp.argsort(ids_b, stable=True)  # pragma: no mutate
  srt = ids_b[order]
  # Equivalent mutants: with float (default-dtype) flags the cumulative sum
  # is still an exact small integer, and `.set` casts it back into int32.
  # (The pragma sits inside the brackets: there mutmut applies it to its own
  # line; after a statement it covers only the statement's first line.)
  is_new = jnp.concatenate(
      [jnp.zeros((1,), jnp.int32), (srt[1:] != srt[:-1]).astype(jnp.int32)],  # pragma: no mutate
  )
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
  # Equivalent mutants of the next two lines: the default dtype (None) is
  # float32, and x is float32 in every caller (make_credit_batch casts).
  w = valid.astype(jnp.float32)  # pragma: no mutate
  big = jnp.asarray(jnp.inf, x.dtype)  # pragma: no mutate
  lo = jax.ops.segment_min(jnp.where(valid, x, big), seg, num_segments=num_segments)
  # Equivalent mutants of the fill values on the next two lines: an empty
  # segment's lo is read only by invalid entries, and invalid entries carry
  # weight 0 in every sum and are set to 0 at the end.
  lo = jnp.where(jnp.isfinite(lo), lo, 0.0)  # empty segments  # pragma: no mutate
  x = jnp.where(valid, x - lo[seg], 0.0)  # pragma: no mutate
  cnt = jax.ops.segment_sum(w, seg, num_segments=num_segments)
  mean = jax.ops.segment_sum(w * x, seg, num_segments=num_segments)
  # Equivalent mutants (a floor of 2 instead of 1): the floor binds only for
  # cnt 0 (sum 0) or cnt 1, whose one shifted entry is exactly 0.
  mean = mean / jnp.maximum(cnt, 1.0)  # pragma: no mutate
  dev = x - mean[seg]
  out = dev
  if scale_by_std:
    var = jax.ops.segment_sum(w * dev * dev, seg, num_segments=num_segments)
    var = var / jnp.maximum(cnt - ddof, 1.0)
    scale = jnp.sqrt(var)[seg] + eps
    # A constant segment has dev == 0; keep it 0 even with eps = 0.
    # Equivalent mutants: the inner `where` only keeps 0/0 out of the division
    # (its fill is masked by the outer one), and scale == 0 means dev == 0
    # here, so `scale >= 0` outside gives the same 0, except when dev^2
    # underflows (|dev| < 1e-19), where both results lie within 1e-19 of 0.
    out = jnp.where(scale > 0, dev / jnp.where(scale > 0, scale, 1.0), 0.0)  # pragma: no mutate
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
  # Equivalent mutants: arange's default int is int32 too.
  rows = jnp.arange(b, dtype=jnp.int32)  # pragma: no mutate
  first_e = jax.ops.segment_min(rows, ep_b, num_segments=b)
  # Equivalent mutant `<=`: an empty slot's minimum is the int32 maximum and
  # a present one's is a row index < b; neither equals b.
  present_e = first_e < b  # pragma: no mutate
  # Equivalent mutants: a float flag gives the same `max > 0`.
  has_action_b = jnp.any(loss_mask_bt > 0, axis=1).astype(jnp.int32)  # pragma: no mutate
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
  # Equivalent mutants of the fill -1: it lands only in the dropped segment.
  last = jax.ops.segment_max(jnp.where(mf, flat, -1), seg, num_segments=n)  # pragma: no mutate
  # The clips only matter for turns that do not exist (segment_min/max of an
  # empty segment give the int32 maximum/minimum). Equivalent mutants: first
  # is never < 0 and last never > b*t - 1, so those bounds never bind. The
  # other bounds are checked by test_turn_table_hand_example_with_a_turn_on_
  # the_very_last_token (a turn on flat index b*t - 1).
  return TurnTable(
      seg_bt=seg.reshape(b, t),
      reward_ek=reward_ek,
      count_ek=count_ek,
      exists_ek=count_ek > 0,
      first_ek=jnp.clip(first[:-1], 0, b * t - 1).reshape(b, k),  # pragma: no mutate
      last_ek=jnp.clip(last[:-1], 0, b * t - 1).reshape(b, k),  # pragma: no mutate
  )


def gather_turns(x_ek: jax.Array, table: TurnTable) -> jax.Array:
  """Broadcasts a per-(episode, turn) value to its action tokens; 0 elsewhere."""
  # Equivalent mutant: a longer zero pad (index B*K still reads a 0). The
  # pad's dtype is checked by test_turn_table_hand_example_with_a_turn_on_
  # the_very_last_token (int32 in, int32 out).
  flat = jnp.concatenate([x_ek.reshape(-1), jnp.zeros((1,), x_ek.dtype)])  # pragma: no mutate
  return flat[table.seg_bt]


def reverse_cumcount(mask_bt: jax.Array) -> jax.Array:
  """Number of mask-1 tokens strictly after each position of its row."""
  m = mask_bt.astype(jnp.int32)
  return jnp.flip(jnp.cumsum(jnp.flip(m, axis=1), axis=1), axis=1) - m
