"""DAPO's data-side tricks: dynamic sampling and overlong reward shaping."""
from typing import Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.credit.segments import (dense_rank, episode_table, per_episode,
                                      turn_table)

OVERLONG_MODES = ("turn", "episode")


# ---------------------------------------------------------------- dynamic sampling
def informative_groups_np(group_id, returns, episode_id=None, tol: float = 0.0
                          ) -> Tuple[np.ndarray, int]:
  """Host-side: which rows belong to groups whose returns are not all equal.

  A group whose returns span at most `tol` carries no group-relative signal
  (DAPO dynamic sampling). Each episode counts once when `episode_id` is
  given (only its first row's return is read). Returns (keep_b bool[B],
  number of groups dropped).
  """
  group_id = np.asarray(group_id)
  # Equivalent mutants: hi / lo below are float64 whatever dtype returns has.
  returns = np.asarray(returns, np.float64)  # pragma: no mutate
  if episode_id is not None:
    _, first = np.unique(np.asarray(episode_id), return_index=True)
    g_rep, r_rep = group_id[first], returns[first]
  else:
    g_rep, r_rep = group_id, returns
  groups, inv = np.unique(g_rep, return_inverse=True)
  hi = np.full(len(groups), -np.inf)
  lo = np.full(len(groups), np.inf)
  np.maximum.at(hi, inv, r_rep)
  np.minimum.at(lo, inv, r_rep)
  informative = groups[(hi - lo) > tol]
  keep = np.isin(group_id, informative)
  return keep, int(len(groups) - len(informative))


def informative_group_mask(batch: CreditBatch, tol: float = 0.0) -> jax.Array:
  """Jit-safe version on a `CreditBatch`: bool[B] rows of informative groups.

  Use it to zero the loss mask of uninformative groups when the batch shape
  must stay fixed.
  """
  b = batch.return_b.shape[0]
  ep = episode_table(batch.episode_id_b, batch.loss_mask_bt)
  grp_e = per_episode(dense_rank(batch.group_id_b), ep)
  ret_e = per_episode(batch.return_b, ep)
  hi = jax.ops.segment_max(jnp.where(ep.valid_e, ret_e, -jnp.inf), grp_e, num_segments=b)
  lo = jax.ops.segment_min(jnp.where(ep.valid_e, ret_e, jnp.inf), grp_e, num_segments=b)
  informative_g = (hi - lo) > tol
  return informative_g[dense_rank(batch.group_id_b)]


def collect_informative_groups(draw_round: Callable[[int], Dict[str, np.ndarray]],
                               groups_needed: int, max_rounds: int, tol: float = 0.0):
  """Host loop: draws rounds until `groups_needed` informative groups are in.

  `draw_round(i)` returns a dict of per-row numpy arrays that includes
  'group_id' and 'return' (and optionally 'episode_id'). Groups are
  re-labelled 0..n-1 across rounds (ids may repeat between rounds). Stops
  after `max_rounds` rounds even if short. Returns (dict of concatenated
  rows of the first `groups_needed` informative groups, stats with rounds,
  dropped_groups, kept_groups).
  """
  parts, kept, dropped, rounds = [], 0, 0, 0
  while kept < groups_needed and rounds < max_rounds:
    data = draw_round(rounds)
    rounds += 1
    keep, n_drop = informative_groups_np(data["group_id"], data["return"],
                                         data.get("episode_id"), tol)
    dropped += n_drop
    if not keep.any():
      continue
    sub = {k: np.asarray(v)[keep] for k, v in data.items()}
    _, dense = np.unique(sub["group_id"], return_inverse=True)
    n_new = min(int(dense.max()) + 1, groups_needed - kept)
    take = dense < n_new
    sub = {k: v[take] for k, v in sub.items()}
    sub["group_id"] = dense[take] + kept
    parts.append(sub)
    kept += n_new
  out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}
  return out, {"rounds": rounds, "dropped_groups": dropped, "kept_groups": kept}


# ---------------------------------------------------------------- overlong shaping
def overlong_penalty(length, max_len: int, buffer_len: int, factor: float = 1.0):
  """DAPO soft overlong punishment: min(-(L - (L_max - L_buf)) / L_buf * f, 0).

  0 up to L_max - L_buf, linear down to -factor at L_max, and held at
  -factor beyond (DAPO's third case; the formula alone would keep falling).
  """
  if not 0 < buffer_len <= max_len:
    raise ValueError(f"need 0 < buffer_len <= max_len, got {buffer_len}, {max_len}")
  length = jnp.asarray(length, jnp.float32)
  pen = -(length - (max_len - buffer_len)) / buffer_len * factor
  return jnp.clip(pen, -abs(factor), 0.0)


def shape_overlong(batch: CreditBatch, *, max_len: int, buffer_len: int,
                   factor: float = 1.0, per: str = "turn", length_b=None,
                   max_turns: Optional[int] = None) -> CreditBatch:
  """Adds the overlong penalty to rewards and returns.

  per='turn': L = the turn's number of action tokens against the per-turn
    budget `max_len`; the penalty lands on the turn's last action token.
  per='episode': L = `length_b` (the session's context length, same on all
    its rows; default: its total number of action tokens) against the
    context cap `max_len`; the penalty lands on the last action token of the
    session's last turn.
  `return_b` of every row of the session grows by the session's total
  penalty, so outcome estimators see it too.
  """
  if per not in OVERLONG_MODES:
    raise ValueError(f"per must be one of {OVERLONG_MODES}, got {per!r}")
  b, t = batch.reward_bt.shape
  k = t if max_turns is None else int(max_turns)
  ep = episode_table(batch.episode_id_b, batch.loss_mask_bt)
  tt = turn_table(batch.reward_bt, batch.loss_mask_bt, batch.turn_idx_bt, ep.ep_b, k)
  if per == "turn":
    pen_ek = jnp.where(tt.exists_ek, overlong_penalty(tt.count_ek, max_len, buffer_len,
                                                      factor), 0.0)
  else:
    if length_b is None:
      length_e = jnp.sum(tt.count_ek, axis=1)
    else:
      length_e = per_episode(jnp.asarray(length_b), ep)
    pen_e = jnp.where(ep.valid_e, overlong_penalty(length_e, max_len, buffer_len, factor), 0.0)
    last_turn = jnp.max(jnp.where(tt.exists_ek, jnp.arange(k)[None, :], -1), axis=1)
    pen_ek = jnp.where(jnp.arange(k)[None, :] == last_turn[:, None], pen_e[:, None], 0.0)
  add = jnp.zeros((b * t,), jnp.float32).at[tt.last_ek.reshape(-1)].add(pen_ek.reshape(-1))
  reward = batch.reward_bt + add.reshape(b, t)
  ret = batch.return_b + jnp.sum(pen_ek, axis=1)[ep.ep_b]
  return batch._replace(reward_bt=reward, return_b=ret)
