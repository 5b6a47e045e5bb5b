"""Discounted reward-to-go per turn: the per-turn contrast to MS-GRPO."""
import jax
import jax.numpy as jnp

from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.credit.segments import (dense_rank, episode_table, gather_turns,
                                      per_episode, segment_normalize, turn_table)

RTG_NORMS = ("group_turn", "group", "global", "none")


def discounted_turn_returns(reward_ek: jax.Array, gamma: float) -> jax.Array:
  """G_k = sum_{j >= k} gamma^(j - k) r_j along axis 1."""

  def step(g_next, r_k):
    g = r_k + gamma * g_next
    return g, g

  _, g_ke = jax.lax.scan(step, jnp.zeros(reward_ek.shape[:1]), reward_ek.T, reverse=True)
  return g_ke.T


def return_to_go(batch: CreditBatch, *, gamma: float = 1.0, norm: str = "group_turn",
                 eps: float = 1e-6, scale_by_std: bool = True, ddof: int = 0,
                 max_turns=None):
  """Turn t of session i gets G_{i,t} = sum_{k >= t} gamma^(k-t) r_{i,k}.

  r_{i,k} is the sum of the action-token rewards of turn k (over whichever
  rows hold it). `norm` picks the statistics G is normalised with:
  'group_turn' (same group and same turn index; each session once),
  'group' (all turns of the group), 'global' (all turns in the batch), or
  'none' (raw G). No critic: the value target is None.
  """
  if norm not in RTG_NORMS:
    raise ValueError(f"norm must be one of {RTG_NORMS}, got {norm!r}")
  if ddof not in (0, 1):
    raise ValueError(f"ddof must be 0 or 1, got {ddof!r}")
  b, t = batch.reward_bt.shape
  k = t if max_turns is None else int(max_turns)
  ep = episode_table(batch.episode_id_b, batch.loss_mask_bt)
  tt = turn_table(batch.reward_bt, batch.loss_mask_bt, batch.turn_idx_bt, ep.ep_b, k)
  g_ek = discounted_turn_returns(tt.reward_ek, gamma)
  valid = tt.exists_ek & ep.valid_e[:, None]
  grp_e = per_episode(dense_rank(batch.group_id_b), ep)
  turn = jnp.arange(k)[None, :]
  if norm == "none":
    # Equivalent mutants of the fill: gather_turns reads only turns that
    # exist, and an existing turn's episode is valid, so valid == exists there.
    a_ek = jnp.where(valid, g_ek, 0.0)  # pragma: no mutate
  else:
    if norm == "group_turn":
      seg, n = grp_e[:, None] * k + turn, b * k
    elif norm == "group":
      seg, n = jnp.broadcast_to(grp_e[:, None], (b, k)), b
    else:
      # Equivalent mutants: a larger segment count only adds empty segments.
      seg, n = jnp.zeros((b, k), jnp.int32), 1  # pragma: no mutate
    a_ek = segment_normalize(g_ek.reshape(-1), seg.reshape(-1), valid.reshape(-1), n,
                             eps, scale_by_std, ddof).reshape(b, k)
  return gather_turns(a_ek, tt), None
