"""MT-GRPO: the outcome advantage plus a group-normalised verifiable turn reward.

The env reports a turn reward beside its reward (`CreditBatch.turn_reward_bt`,
e.g. 1 for a valid action, a tool that ran): a signal about the turn itself
that is not part of the episode's return. MT-GRPO (arXiv 2505.11821)
normalises it within the group and adds it to the GRPO outcome advantage.
How the turn rewards of several turns are combined is `turn_credit`; two of
the three ways normalise per turn index, which verl issue #7244 shows to be
biased for one of them when the policy decides when to stop (docs/credit.md).
"""
import jax
import jax.numpy as jnp

from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.credit.outcome import episode_group_advantage
from mtrl_jax.credit.returns import discounted_turn_returns
from mtrl_jax.credit.segments import gather_turns, segment_normalize, turn_table
from mtrl_jax.credit.step_groups import step_table

TURN_CREDITS = ("own", "normalise_then_sum", "sum_then_normalise")
TURN_SIGNALS = ("turn_reward", "reward")


def mt_grpo(batch: CreditBatch, *, turn_weight: float = 1.0, outcome_weight: float = 1.0,
            turn_credit: str = "own", turn_signal: str = "turn_reward", pad_finished: bool = False,
            eps: float = 1e-6, scale_by_std: bool = True, ddof: int = 0, max_turns=None):
  """A_{i,t} = outcome_weight * A^O_i + turn_weight * A^T_{i,t}.

  A^O_i = (R_i - mean_g R) / (std_g R + eps): the GRPO outcome advantage.
  u_{i,t} = the turn reward of turn t (sum over its action tokens of
  `turn_reward_bt`; all zeros when the batch has none, which makes this
  grpo); with `turn_signal='reward'` the env's own per-turn rewards instead
  (the outcome then arrives as the last turn's u: how a per-turn port of
  MT-GRPO that has no separate turn signal uses it). norm_{g,k}(x)
  normalises x over the sessions of group g that have a turn k (each
  session once); with `pad_finished` over every session of the group that
  is valid, a session that ended before turn k counting as u = 0 there
  (up to the group's longest session). `turn_credit`:
    'own'                A^T_{i,t} = norm_{g,t}(u)_{i,t}  (the paper's turn term:
                         each turn is judged by its own turn reward)
    'normalise_then_sum' A^T_{i,t} = sum_{k >= t} norm_{g,k}(u)_{i,k}  (per-turn
                         normalised, then accumulated to the end: the
                         construction verl #7244 finds biased)
    'sum_then_normalise' A^T_{i,t} = norm_{g,t}(sum_{k >= t} u_{i,k})  (the turn
                         rewards still to come, normalised once at turn t)
  With `pad_finished` the sum of 'normalise_then_sum' also runs over a
  session's padded turns (0 - mean) / std after its end, so every session
  of a group subtracts the same per-turn baselines whatever its length.
  """
  if turn_signal not in TURN_SIGNALS:
    raise ValueError(f"turn_signal must be one of {TURN_SIGNALS}, got {turn_signal!r}")
  if turn_credit not in TURN_CREDITS:
    raise ValueError(f"turn_credit must be one of {TURN_CREDITS}, got {turn_credit!r}")
  if ddof not in (0, 1):
    raise ValueError(f"ddof must be 0 or 1, got {ddof!r}")
  b, t = batch.reward_bt.shape
  k = t if max_turns is None else int(max_turns)
  adv_e, ep = episode_group_advantage(batch, eps=eps, scale_by_std=scale_by_std, ddof=ddof)
  st = step_table(batch, ep, k)
  if turn_signal == "reward":
    u_ek = st.turns.reward_ek
  elif batch.turn_reward_bt is None:
    u_ek = jnp.zeros((b, k), jnp.float32)
  else:
    u_ek = turn_table(batch.turn_reward_bt, batch.loss_mask_bt, batch.turn_idx_bt, ep.ep_b, k).reward_ek
  u_ek = jnp.where(st.live_ek, u_ek, 0.0)
  counted = st.live_ek
  if pad_finished:
    turn = jnp.arange(k)[None, :]
    length_e = jnp.max(jnp.where(st.live_ek, turn + 1, 0), axis=1)
    longest_g = jax.ops.segment_max(length_e, st.group_e, num_segments=b)
    counted = ep.valid_e[:, None] & (turn < longest_g[st.group_e][:, None])
  if turn_credit == "sum_then_normalise":
    u_ek = discounted_turn_returns(u_ek, 1.0)
  seg = st.group_e[:, None] * k + jnp.arange(k)[None, :]
  a_t = segment_normalize_ek(u_ek, seg, counted, eps, scale_by_std, ddof)
  if turn_credit == "normalise_then_sum":
    a_t = discounted_turn_returns(a_t, 1.0)
  a_ek = jnp.where(st.live_ek, outcome_weight * adv_e[:, None] + turn_weight * a_t, 0.0)
  return gather_turns(a_ek, st.turns), None


def segment_normalize_ek(x_ek, seg_ek, valid_ek, eps, scale_by_std, ddof):
  """`segment_normalize` over a [B, K] table (segments < B * K)."""
  b, k = x_ek.shape
  out = segment_normalize(x_ek.reshape(-1), seg_ek.reshape(-1), valid_ek.reshape(-1), b * k, eps,
                          scale_by_std, ddof)
  return out.reshape(b, k)
