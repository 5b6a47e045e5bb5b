"""Step-level groups without a critic: GiGPO's anchor states and HGPO's nested histories.

A group-relative estimator compares a session with the other sessions of its
task. These two also compare single turns: turns of different sessions of
the same task that stand in the same environment state (the same *anchor
state*, an id the environment reports, `CreditBatch.state_id_bt`) form a step
group, and each turn's discounted return from that turn on is normalised
within it. A turn whose state no other session of its task reached, or that
has no state id, gets no step term: it falls back to the episode-level
advantage alone. `step_group_stats` counts how many turns found a group.

Both work in the session and the per-turn layout (the turn table reads each
(episode, turn) once, wherever its tokens sit) and return no value target.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp

from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.credit.outcome import episode_group_advantage
from mtrl_jax.credit.returns import discounted_turn_returns
from mtrl_jax.credit.segments import (EpisodeTable, TurnTable, dense_rank, episode_table,
                                      gather_turns, per_episode, segment_normalize, turn_table)


def pair_rank(a: jax.Array, b: jax.Array) -> jax.Array:
  """Dense ranks of the pairs (a_i, b_i): equal pairs share a rank in [0, n).

  A lexicographic sort, so any int32 values work (no packing into one int
  that could overflow).
  """
  order = jnp.lexsort((b, a))
  sa, sb = a[order], b[order]
  new = jnp.concatenate([jnp.zeros((1,), jnp.int32),
                         ((sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])).astype(jnp.int32)])
  return jnp.zeros(a.shape, jnp.int32).at[order].set(jnp.cumsum(new))


class StepTable(NamedTuple):
  """Per (episode slot, turn) quantities of the step-group estimators, [B, K].

  turns: the `TurnTable` (rewards, existence, token positions).
  episodes: the `EpisodeTable`.
  group_e: int32[B] dense group rank of each episode slot.
  state_ek: int32[B, K] the turn's anchor state id as given (-1: none, or no turn).
  live_ek: bool[B, K] the turn exists in a valid episode.
  keyed_ek: live and with a state id (>= 0).
  """
  turns: TurnTable
  episodes: EpisodeTable
  group_e: jax.Array
  state_ek: jax.Array
  live_ek: jax.Array
  keyed_ek: jax.Array


def step_table(batch: CreditBatch, episodes: EpisodeTable, max_turns: int) -> StepTable:
  tt = turn_table(batch.reward_bt, batch.loss_mask_bt, batch.turn_idx_bt, episodes.ep_b, max_turns)
  live = tt.exists_ek & episodes.valid_e[:, None]
  if batch.state_id_bt is None:
    state = jnp.full(live.shape, -1, jnp.int32)
  else:
    # Read at the turn's first action token; ids are only compared, never ranked here.
    sid = jnp.asarray(batch.state_id_bt, jnp.int32).reshape(-1)[tt.first_ek]
    state = jnp.where(live & (sid >= 0), sid, -1)
  group_e = per_episode(dense_rank(batch.group_id_b), episodes)
  return StepTable(tt, episodes, group_e, state, live, live & (state >= 0))


def history_levels(st: StepTable, depth: int):
  """[(key_ek, keyed_ek)] for l = 0..depth: turns with equal key share their
  task group, their own anchor state and the anchor states of their previous
  l turns (level 0 is GiGPO's step group). A turn whose previous l turns do
  not all exist with a state id has no key at level l."""
  b, k = st.state_ek.shape
  grp = jnp.broadcast_to(st.group_e[:, None], (b, k))
  key = pair_rank(jnp.where(st.keyed_ek, grp, -1).reshape(-1), st.state_ek.reshape(-1))
  keyed = st.keyed_ek
  out = [(key.reshape(b, k), keyed)]
  for l in range(1, depth + 1):
    prev = jnp.concatenate([jnp.full((b, l), -1, jnp.int32), st.state_ek[:, :-l]], axis=1)[:, :k]
    keyed = keyed & (prev >= 0)
    key = pair_rank(jnp.where(keyed.reshape(-1), key, -1), prev.reshape(-1))
    out.append((key.reshape(b, k), keyed))
  return out


def _normalise_in_groups(g_ek, key_ek, keyed_ek, eps, scale_by_std, ddof):
  """(the normalised step return within each key's group, group has >= 2 turns)."""
  b, k = g_ek.shape
  n = b * k
  seg, ok = key_ek.reshape(-1), keyed_ek.reshape(-1)
  # Equivalent mutants: astype's default dtype (None) is float32 too.
  cnt = jax.ops.segment_sum(ok.astype(jnp.float32), seg, num_segments=n)[seg]  # pragma: no mutate
  a = segment_normalize(g_ek.reshape(-1), seg, ok, n, eps, scale_by_std, ddof)
  return a.reshape(b, k), (ok & (cnt >= 2.0)).reshape(b, k)


def _check(ddof, gamma, max_turns):
  if ddof not in (0, 1):
    raise ValueError(f"ddof must be 0 or 1, got {ddof!r}")
  if not isinstance(gamma, jax.Array) and not 0.0 <= float(gamma) <= 1.0:
    raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
  if max_turns is not None and int(max_turns) < 1:
    raise ValueError(f"max_turns must be >= 1 or None, got {max_turns!r}")


def gigpo(batch: CreditBatch, *, gamma: float = 0.95, step_weight: float = 1.0, eps: float = 1e-6,
          scale_by_std: bool = False, ddof: int = 0, max_turns=None):
  """GiGPO (arXiv 2505.10978): A = A_episode + step_weight * A_step.

  A_episode = (R_i - mean_g R) / F (F = std + eps with `scale_by_std`, else
  1), the GRPO advantage of the session within its task group (each
  episode counted once). A_step: every turn of the task group whose anchor
  state id is the same forms a step group; each member's discounted return
  from that turn, G_{i,t} = sum_{k >= t} gamma^(k-t) r_{i,k}, is normalised
  within it the same way. A turn alone in its step group, or without a
  state id, gets A_step = 0 (exactly): only the episode term. The
  defaults follow the reference code (verl-agent): gamma 0.95, weight 1,
  mean-only normalisation (`mode="mean_norm"`; `scale_by_std=True` is its
  "mean_std_norm").
  """
  _check(ddof, gamma, max_turns)
  b, t = batch.reward_bt.shape
  k = t if max_turns is None else int(max_turns)
  adv_e, ep = episode_group_advantage(batch, eps=eps, scale_by_std=scale_by_std, ddof=ddof)
  st = step_table(batch, ep, k)
  g_ek = discounted_turn_returns(st.turns.reward_ek, gamma)
  (key, keyed), = history_levels(st, 0)
  a_step, _ = _normalise_in_groups(g_ek, key, keyed, eps, scale_by_std, ddof)
  a_ek = jnp.where(st.live_ek, adv_e[:, None] + step_weight * a_step, 0.0)
  return gather_turns(a_ek, st.turns), None


def hgpo(batch: CreditBatch, *, depth: int = 2, alpha: float = 1.0, gamma: float = 0.95,
         step_weight: float = 1.0, episode_weight: float = 1.0, eps: float = 1e-6,
         scale_by_std: bool = False, ddof: int = 0, max_turns=None):
  """HGPO (arXiv 2602.22817): step groups nested by how much history they share.

  Level l = 0..depth: turns of the same task group with the same anchor
  state and the same anchor states on their previous l turns (level 0 is
  GiGPO's step group; each level's groups split the one above). At every
  level where a turn's group has >= 2 members its discounted return G is
  normalised within that group, giving A_l; the levels are averaged with
  weights (l + 1)^alpha over the levels where the turn has such a group,
  so deeper (more consistent) histories weigh more:
    A_hier = sum_l w_l A_l / sum_l w_l,  A = episode_weight * A_episode + step_weight * A_hier.
  A turn with no group at any level gets A_hier = 0. Defaults: the
  reference recipe's (verl-agent recipe/hgpo: history length 2, alpha 1,
  mean-only normalisation) plus GiGPO's episode term.
  """
  _check(ddof, gamma, max_turns)
  if int(depth) < 0:
    raise ValueError(f"depth must be >= 0, got {depth!r}")
  b, t = batch.reward_bt.shape
  k = t if max_turns is None else int(max_turns)
  adv_e, ep = episode_group_advantage(batch, eps=eps, scale_by_std=scale_by_std, ddof=ddof)
  st = step_table(batch, ep, k)
  g_ek = discounted_turn_returns(st.turns.reward_ek, gamma)
  num = jnp.zeros((b, k), jnp.float32)
  den = jnp.zeros((b, k), jnp.float32)
  for l, (key, keyed) in enumerate(history_levels(st, int(depth))):
    a_l, has_l = _normalise_in_groups(g_ek, key, keyed, eps, scale_by_std, ddof)
    w = jnp.where(has_l, jnp.float32(l + 1) ** alpha, 0.0)
    num = num + w * a_l
    den = den + w
  a_hier = jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)
  a_ek = jnp.where(st.live_ek, episode_weight * adv_e[:, None] + step_weight * a_hier, 0.0)
  return gather_turns(a_ek, st.turns), None


def step_group_stats(batch: CreditBatch, max_turns=None, depth: int = 0) -> dict:
  """How many turns found a step group: {'turns', 'keyed', 'grouped'} (int32 scalars).

  turns: turns (with an action token) of valid episodes; keyed: those with
  a state id; grouped: those sharing their task group and anchor state with
  at least one other turn (and, for depth > 0, the previous `depth` anchor
  states too: HGPO's deepest level).
  """
  b, t = batch.reward_bt.shape
  k = t if max_turns is None else int(max_turns)
  st = step_table(batch, episode_table(batch.episode_id_b, batch.loss_mask_bt), k)
  key, keyed = history_levels(st, int(depth))[-1]
  zeros = jnp.zeros((b, k), jnp.float32)
  _, grouped = _normalise_in_groups(zeros, key, keyed, 1e-6, False, 0)
  return {"turns": jnp.sum(st.live_ek.astype(jnp.int32)),
          "keyed": jnp.sum(st.keyed_ek.astype(jnp.int32)),
          "grouped": jnp.sum(grouped.astype(jnp.int32))}
