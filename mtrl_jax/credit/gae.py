"""Critic-based estimators: token-level, turn-level and bi-level GAE.

Common options (Python values; gamma, lambdas and alpha may also be jnp
scalars, e.g. to vmap a sweep over them):
  gamma: discount per step (token for `gae`, turn for `turn_gae`).
  lambda_policy: lambda of the advantages (default 0.95).
  lambda_critic: lambda of the value targets (default 1.0 = Monte Carlo).
    Separate lambdas follow VC-PPO (arXiv 2503.01491) and VAPO (2504.05118).
  length_adaptive, alpha: VAPO's lambda_policy = 1 - 1 / (alpha * l), with
    l the episode's number of action tokens (number of turns for
    `turn_gae`), clamped to [0, 1]. Replaces lambda_policy when on.
  max_turns: static bound K on turn indices (default T). Action tokens with
    turn index >= K are ignored by the turn bookkeeping (their advantage is
    0 in `turn_gae`/`bilevel_gae`, and `gae` cannot link rows across them).

Every function returns (adv_bt, value_target_bt), both exactly 0 where the
loss mask is 0. Sessions end at their last action token (no bootstrap). A
missing critic (`value_bt=None`) counts as zeros.
"""
import jax
import jax.numpy as jnp

from mtrl_jax.credit.batch import CreditBatch, values_or_zeros
from mtrl_jax.credit.segments import (episode_table, reverse_cumcount,
                                      gather_turns, turn_table)

TURN_VALUE_AT = ("first", "last")


def adaptive_lambda(length, alpha: float = 0.05) -> jax.Array:
  """VAPO's length-adaptive lambda 1 - 1 / (alpha * l), clamped to [0, 1]."""
  # Equivalent mutants on the next lines (alpha > 0, length >= 0 here):
  # an int or default-dtype length gives the same float32 product; for
  # 0 <= denom <= 1 the formula gives lam <= 0, which the clip turns into the
  # same 0 the `pos` guard gives, so `>= 0` or `> 1` change nothing; the
  # inner `where` fill is masked by the outer one; and lam < 1 always, so the
  # upper clip bound never binds.
  denom = alpha * jnp.asarray(length, jnp.float32)  # pragma: no mutate
  pos = denom > 0  # pragma: no mutate
  lam = jnp.where(pos, 1.0 - 1.0 / jnp.where(pos, denom, 1.0), 0.0)  # pragma: no mutate
  return jnp.clip(lam, 0.0, 1.0)  # pragma: no mutate


def masked_reverse_gae(r_bt, v_bt, m_bt, gamma, lam_b, cut_bt=None) -> jax.Array:
  """GAE along axis 1 that steps over mask-0 positions instead of through them.

  At a mask-1 position t with next mask-1 position n (same row):
    delta_t = r_t + gamma * V_n - V_t,   A_t = delta_t + gamma * lam * A_n.
  With no such n (end of row), or where `cut_bt` is set (t ends a segment,
  its reward already holds the whole future), V_n and A_n are 0.
  `lam_b` is a scalar or one lambda per row. Mask-0 positions output 0.
  """
  m = m_bt > 0
  cut = jnp.zeros_like(m) if cut_bt is None else cut_bt
  # Every caller passes lambda as a float32 array (or a Python float without x64): the
  # dtype here is an equivalent mutant; the broadcast below is not.
  lam_b = jnp.asarray(lam_b, jnp.float32)  # pragma: no mutate
  lam_b = jnp.broadcast_to(lam_b, m.shape[:1])
  # The scan below never reads a masked position's r or v (it carries the next
  # unmasked one past it), so these fill values are equivalent mutants.
  r = jnp.where(m, r_bt, 0.0)  # pragma: no mutate
  v = jnp.where(m, v_bt, 0.0)  # pragma: no mutate

  def step(carry, x):
    next_v, next_a = carry
    r_t, v_t, m_t, c_t = x
    nv = jnp.where(c_t, 0.0, next_v)
    na = jnp.where(c_t, 0.0, next_a)
    a_t = r_t + gamma * nv - v_t + gamma * lam_b * na
    carry = (jnp.where(m_t, v_t, next_v), jnp.where(m_t, a_t, next_a))
    return carry, jnp.where(m_t, a_t, 0.0)

  zeros = jnp.zeros(m.shape[:1], jnp.float32)
  xs = (r.T, v.T, m.T, cut.T)
  _, adv_tb = jax.lax.scan(step, (zeros, zeros), xs, reverse=True)
  return adv_tb.T


def _episode_lambda(length_e, ep_b, lam, length_adaptive, alpha):
  if length_adaptive:
    return adaptive_lambda(length_e, alpha)[ep_b]
  return jnp.full(ep_b.shape, lam, jnp.float32)


def _check(lambda_policy, lambda_critic, alpha, gamma):
  # Python numbers are checked; arrays (e.g. a vmapped lambda sweep) pass.
  for name, val in (("lambda_policy", lambda_policy), ("lambda_critic", lambda_critic),
                    ("gamma", gamma)):
    if isinstance(val, (int, float)) and not 0.0 <= val <= 1.0:
      raise ValueError(f"{name} must lie in [0, 1], got {val!r}")
  if isinstance(alpha, (int, float)) and alpha <= 0:
    raise ValueError(f"alpha must be > 0, got {alpha!r}")


def _row_links(batch: CreditBatch, ep_b, k):
  """For each row, the row holding its episode's next counted turn (-1: none).

  "Next" is the smallest counted turn after the row's last one, not turn
  last + 1: a turn without a trainable token (masked, or never trained) is
  stepped over, as the session layout steps over its tokens.
  """
  b, t = batch.reward_bt.shape
  # Equivalent mutant `<= k`: a row whose only counted turn is k gets key
  # (ep + 1) * k, the turn-0 slot of the next episode, which no linked row
  # reads (they read turns >= 1), and k_last = k leaves it unlinked as before.
  in_k = (batch.turn_idx_bt >= 0) & (batch.turn_idx_bt < k)  # pragma: no mutate
  m = (batch.loss_mask_bt > 0) & in_k
  has = jnp.any(m, axis=1)
  k_first = jnp.min(jnp.where(m, batch.turn_idx_bt, k), axis=1)
  # Equivalent mutant of the fill (-2): only rows without a counted turn see
  # it, and `linked` leaves those at -1.
  k_last = jnp.max(jnp.where(m, batch.turn_idx_bt, -1), axis=1)  # pragma: no mutate
  key = jnp.where(has, ep_b * k + k_first, b * k)
  # Equivalent mutants: arange's default int is int32 too.
  rows = jnp.arange(b, dtype=jnp.int32)  # pragma: no mutate
  # Slot ep * k + j holds the row whose first counted turn is j (an empty
  # slot: the int32 minimum); slot b * k collects the rows without one.
  # Equivalent mutants of the fill (+1, -2): only those rows see it, and
  # their slot b * k is dropped just below.
  row_at = jax.ops.segment_max(jnp.where(has, rows, -1), key,  # pragma: no mutate
                               num_segments=b * k + 1)
  row_ek = row_at[:-1].reshape(b, k)
  # For each slot, the first occupied slot at or after it in its episode (k: none).
  # Equivalent mutants: arange's default int is int32 too (and int64 with x64 compares alike).
  turns = jnp.arange(k, dtype=jnp.int32)  # pragma: no mutate
  occupied = jnp.where(row_ek >= 0, turns[None, :], k)
  next_occupied = jax.lax.cummin(occupied, axis=1, reverse=True)
  nxt = k_last + 1
  # nxt and j lie in [0, k]; the value k (no later turn) is not linked, and the
  # clip keeps its read in bounds. Equivalent mutants of the clips (k + 1 for
  # k - 1): JAX clamps an out-of-bounds gather index to k - 1 by itself.
  j = next_occupied[ep_b, jnp.minimum(nxt, k - 1)]  # pragma: no mutate
  linked = has & (nxt < k) & (j < k)
  succ = row_ek[ep_b, jnp.minimum(j, k - 1)]  # pragma: no mutate
  return jnp.where(linked, succ, -1)


def _token_gae(batch: CreditBatch, v_bt, lam_b, gamma, succ_b, hops: int):
  """Token GAE over action tokens, continued across rows of one episode.

  Each row is first solved alone; the tail of row b then receives
  c_b = gamma * V(first token of succ) + gamma * lam * A(first token of succ),
  which reaches token t as (gamma * lam)^(tokens after t) * c_b. Chains are at
  most `hops` rows long, so that many fixed-point sweeps make it exact.
  """
  m = batch.loss_mask_bt > 0
  a0 = masked_reverse_gae(batch.reward_bt, v_bt, m, gamma, lam_b)
  first_t = jnp.argmax(m, axis=1)
  rows = jnp.arange(m.shape[0])
  a0_first = a0[rows, first_t]
  v_first = v_bt[rows, first_t]
  n_b = jnp.sum(m, axis=1)
  decay_b = gamma * lam_b
  has_succ = succ_b >= 0
  s = jnp.maximum(succ_b, 0)

  def sweep(_, c_b):
    a_first_s = a0_first[s] + decay_b[s] ** jnp.maximum(n_b[s] - 1, 0) * c_b[s]
    return jnp.where(has_succ, gamma * v_first[s] + decay_b * a_first_s, 0.0)

  # A chain of n rows is exact after n - 1 sweeps (its last row has no successor); hops = min(b, k)
  # >= n leaves one spare sweep, so starting the loop at 1 changes nothing (an equivalent mutant).
  c_b = jax.lax.fori_loop(0, hops, sweep, jnp.zeros_like(a0_first))  # pragma: no mutate
  after = reverse_cumcount(m)
  adv = a0 + decay_b[:, None] ** after * c_b[:, None]
  return jnp.where(m, adv, 0.0)


def gae(batch: CreditBatch, *, gamma: float = 1.0, lambda_policy: float = 0.95,
        lambda_critic: float = 1.0, length_adaptive: bool = False,
        alpha: float = 0.05, max_turns=None):
  """Token-level GAE over action tokens only.

  Observation tokens are skipped: the successor of an action token is the
  next action token of the session (in the same row or, in the per-turn
  layout, the first action token of the row holding the next turn of the
  same episode). Value targets use lambda_critic: V_target = A^lc + V.
  """
  _check(lambda_policy, lambda_critic, alpha, gamma)
  b, t = batch.reward_bt.shape
  k = t if max_turns is None else int(max_turns)
  v = values_or_zeros(batch)
  table = episode_table(batch.episode_id_b, batch.loss_mask_bt)
  tokens_b = jnp.sum(batch.loss_mask_bt > 0, axis=1)
  # adaptive_lambda casts the count to float32 itself: this dtype is an equivalent mutant.
  tokens_b = tokens_b.astype(jnp.float32)  # pragma: no mutate
  tokens_e = jax.ops.segment_sum(tokens_b, table.ep_b, num_segments=b)
  succ = _row_links(batch, table.ep_b, k)
  hops = min(b, k)
  lam_p = _episode_lambda(tokens_e, table.ep_b, lambda_policy, length_adaptive, alpha)
  lam_c = jnp.full((b,), lambda_critic, jnp.float32)
  adv = _token_gae(batch, v, lam_p, gamma, succ, hops)
  target = _token_gae(batch, v, lam_c, gamma, succ, hops) + v
  return adv, jnp.where(batch.loss_mask_bt > 0, target, 0.0)


def _turn_level(batch: CreditBatch, lambda_policy, length_adaptive, alpha, max_turns,
                value_at):
  """Episode-turn table, per-turn values and the turn-level policy lambda."""
  if value_at not in TURN_VALUE_AT:
    raise ValueError(f"value_at must be one of {TURN_VALUE_AT}, got {value_at!r}")
  b, t = batch.reward_bt.shape
  k = t if max_turns is None else int(max_turns)
  v = values_or_zeros(batch)
  ep = episode_table(batch.episode_id_b, batch.loss_mask_bt)
  tt = turn_table(batch.reward_bt, batch.loss_mask_bt, batch.turn_idx_bt, ep.ep_b, k)
  pos = tt.first_ek if value_at == "first" else tt.last_ek
  # Equivalent mutants of the fill: every reader masks turns that do not
  # exist (masked_reverse_gae, and gather_turns reads existing turns only).
  v_ek = jnp.where(tt.exists_ek, v.reshape(-1)[pos], 0.0)  # pragma: no mutate
  turns_e = jnp.sum(tt.exists_ek, axis=1)
  rows_e = jnp.arange(b)
  lam_p = _episode_lambda(turns_e, rows_e, lambda_policy, length_adaptive, alpha)
  return ep, tt, v, v_ek, lam_p


def turn_gae(batch: CreditBatch, *, gamma: float = 1.0, lambda_policy: float = 0.95,
             lambda_critic: float = 1.0, length_adaptive: bool = False,
             alpha: float = 0.05, max_turns=None, value_at: str = "first"):
  """GAE over turns; every action token of turn t gets A_t.

  r_t = sum of the turn's action-token rewards, V_t = critic value at the
  turn's first action token (`value_at='last'`: its last). The value target
  G_t = A_t^lc + V_t is given to every action token of the turn.
  """
  _check(lambda_policy, lambda_critic, alpha, gamma)
  _, tt, _, v_ek, lam_p = _turn_level(batch, lambda_policy, length_adaptive, alpha,
                                      max_turns, value_at)
  adv_ek = masked_reverse_gae(tt.reward_ek, v_ek, tt.exists_ek, gamma, lam_p)
  tgt_ek = masked_reverse_gae(tt.reward_ek, v_ek, tt.exists_ek, gamma, lambda_critic)
  # Equivalent mutants of the fill: gather_turns reads existing turns only.
  tgt_ek = jnp.where(tt.exists_ek, tgt_ek + v_ek, 0.0)  # pragma: no mutate
  return gather_turns(adv_ek, tt), gather_turns(tgt_ek, tt)


def bilevel_gae(batch: CreditBatch, *, gamma: float = 1.0, gamma_turn: float = 1.0,
                lambda_policy: float = 0.95, lambda_critic: float = 1.0,
                length_adaptive: bool = False, alpha: float = 0.05,
                max_turns=None, value_at: str = "last"):
  """Bi-level GAE (RAGEN / StarPO).

  High level: GAE over turns with `gamma_turn`, the turn's reward being the
  reward on its last action token and V_t the value at its last action token
  (`value_at`), gives the turn's return target G_t = A_t + V_t.
  Low level: token GAE with `gamma` inside each turn, where the turn's last
  action token receives G_t as its reward and does not look past the turn
  (so that token's advantage is G_t - V). Other tokens keep their own
  reward (e.g. a per-token KL penalty).
  Both levels use lambda_policy for advantages and lambda_critic for
  targets; with length_adaptive, the turn level uses l = number of turns and
  the token level l = number of action tokens of the episode.
  """
  # Equivalent mutants: each line checks the lambdas and alpha, so dropping
  # one of them from either line changes nothing. The tests check all five
  # options (test_critic_estimators_reject_out_of_range_options,
  # test_bilevel_gae_rejects_out_of_range_gamma_turn).
  _check(lambda_policy, lambda_critic, alpha, gamma)  # pragma: no mutate
  _check(lambda_policy, lambda_critic, alpha, gamma_turn)  # pragma: no mutate
  b, t = batch.reward_bt.shape
  ep, tt, v, v_ek, lam_turn_p = _turn_level(batch, lambda_policy, length_adaptive,
                                            alpha, max_turns, value_at)
  m = batch.loss_mask_bt > 0
  # Equivalent mutants of the two fills: r_flat is read only at action tokens
  # (last_ek), and r_ek only where a turn exists (masked_reverse_gae zeroes
  # the rest).
  r_flat = jnp.where(m, batch.reward_bt, 0.0).reshape(-1)  # pragma: no mutate
  r_ek = jnp.where(tt.exists_ek, r_flat[tt.last_ek], 0.0)  # pragma: no mutate
  flat = jnp.arange(b * t).reshape(b, t)
  last_bt = gather_turns(tt.last_ek, tt)
  # Equivalent mutant `<=`: it adds only action tokens of turns >= K at flat
  # index 0 (gather_turns gives them last 0), and those are outside in_turn,
  # the mask of the low level, so their eos is never read.
  eos = m & (tt.seg_bt < tt.exists_ek.size) & (flat == last_bt)  # pragma: no mutate
  in_turn = m & (tt.seg_bt < tt.exists_ek.size)
  # Equivalent mutants: astype's default dtype is float32. (The sum's axis
  # is checked by test_bilevel_gae_length_adaptive_uses_turns_high_and_tokens_low.)
  tokens_b = jnp.sum(m, axis=1).astype(jnp.float32)  # pragma: no mutate
  tokens_e = jax.ops.segment_sum(tokens_b, ep.ep_b, num_segments=b)
  lam_tok_p = _episode_lambda(tokens_e, ep.ep_b, lambda_policy, length_adaptive, alpha)

  def two_level(lam_turn, lam_tok):
    a_hi = masked_reverse_gae(r_ek, v_ek, tt.exists_ek, gamma_turn, lam_turn)
    g_bt = gather_turns(a_hi + v_ek, tt)
    # Equivalent mutants of the inner fill: masked_reverse_gae zeroes the
    # rewards outside in_turn, which holds only action tokens.
    r_lo = jnp.where(eos, g_bt, jnp.where(m, batch.reward_bt, 0.0))  # pragma: no mutate
    a_lo = masked_reverse_gae(r_lo, v, in_turn, gamma, lam_tok, cut_bt=eos)
    return a_lo

  adv = two_level(lam_turn_p, lam_tok_p)
  tgt = two_level(lambda_critic, lambda_critic) + v
  return adv, jnp.where(in_turn, tgt, 0.0)
