"""Advantages shuffled within the batch: the study's positive controls (all tokens, or the decision turn's).

The shuffled estimator keeps the batch's advantages as a multiset (same mean,
spread and scale, so the same step sizes) and breaks their pairing with the
tokens they were computed for. An experiment whose real estimator does not
beat its shuffled twin cannot detect a credit difference at all: it is
underpowered, whatever its other comparisons say.

Shuffling every token also breaks the credit of the reply format (the study's
format penalty), so that control compares learning with no learning. The
graded one (`shuffle_decision_advantages`, issue 41) touches only the decision
turn and only a fraction of the sessions: the weakening is known (a fraction q
of the choices credited with another session's advantage), and running several
q measures the smallest credit loss the design can see.

It keeps the decision turn's format credit out of the shuffle by drawing
only among *eligible* sessions: those whose decision-turn reply was valid
(the caller passes `eligible_b`; for the trainer, `valid_decision_rows` of
the packed batch's per-token invalid flags). An invalid decision reply's
format penalty is part of that turn's credit; handed to a session whose
reply was fine (and the fine reply's credit to the malformed one), it would
weaken the format signal as well as the choice's. Sessions with an invalid
decision reply keep their credit exactly. So q is a fraction of the
*eligible* sessions: each update draws exactly round(q x n_eligible) of
them, and the weakening is "a share q of the valid choices credited with
another valid choice's advantage". Whether that keeps the reply format in
training is a measurement, not a property of this code: see
docs/STUDY_ROUND3.md.

Why eligibility and not "shuffle the credit computed without the penalty,
then add the penalty's credit back": that split is exact only for
estimators linear in the rewards at fixed values (GAE); GRPO-style
normalisation by the group's spread mixes the penalty into every session's
advantage, so no per-session "penalty credit" exists to keep apart.
"""
import jax
import jax.numpy as jnp


def shuffle_advantages(adv_bt: jax.Array, mask_bt: jax.Array, key: jax.Array) -> jax.Array:
  """A uniform random permutation of adv over the tokens where mask > 0; elsewhere adv is kept (0 there).

  Pure jnp, static shapes: masked positions get random sort keys, the others sort last, and the
  masked values in that random order are written back to the masked positions in index order.
  """
  if adv_bt.shape != mask_bt.shape:
    raise ValueError(f"advantages {adv_bt.shape} and mask {mask_bt.shape} differ in shape")
  a_n, m_n = adv_bt.reshape(-1), mask_bt.reshape(-1) > 0
  n = a_n.shape[0]
  src = jnp.argsort(jnp.where(m_n, jax.random.uniform(key, (n,)), 2.0))  # masked first, random order
  dst = jnp.argsort(jnp.where(m_n, jnp.arange(n) / n, 2.0))  # masked first, index order
  out = jnp.zeros_like(a_n).at[dst].set(a_n[src])  # the unmasked tails map onto each other
  return out.reshape(adv_bt.shape)


def valid_decision_rows(mask_bt: jax.Array, turn_idx_bt: jax.Array, invalid_bt: jax.Array,
                        decision_turn: int = 0) -> jax.Array:
  """bool [B]: the rows none of whose decision tokens (mask > 0 on turn `decision_turn`) lies on an
  invalid turn (`invalid_bt`, per token). Rows without decision tokens come out True; they are
  never drawn anyway."""
  if not mask_bt.shape == turn_idx_bt.shape == invalid_bt.shape:
    raise ValueError(f"mask {mask_bt.shape}, turn ids {turn_idx_bt.shape} and invalid flags {invalid_bt.shape} "
                     "differ in shape")
  dec_bt = (mask_bt > 0) & (turn_idx_bt == decision_turn)
  return ~jnp.any(dec_bt & (invalid_bt > 0), axis=1)


def shuffle_decision_advantages(adv_bt: jax.Array, mask_bt: jax.Array, turn_idx_bt: jax.Array, key: jax.Array,
                                fraction=1.0, decision_turn: int = 0, eligible_b=None) -> jax.Array:
  """The graded control: a fraction of the eligible rows' decision-turn credit handed to other eligible
  rows; all else kept.

  A row's decision tokens are its action tokens (mask > 0) of turn `decision_turn`; its decision
  advantage d is their mean (bit for bit the shared value when they share one). A row may be drawn
  if it has decision tokens and `eligible_b` (bool [B]; None: every row) holds for it; exactly
  round(fraction x n) of those n rows are drawn uniformly (a session is one row in both layouts: the
  session row, or the turn row that trains turn 0); the drawn rows, taken in a random order, each get
  the next one's d (a random cycle: with 2 or more drawn, no row keeps its own), written on all their
  decision tokens. So the multiset of the eligible rows' d is kept (the step sizes stay), every token
  off the decision turn, every undrawn or ineligible row and the padding keep their values, and the
  choice's credit is another eligible session's on a fraction of the eligible sessions. One drawn row
  (fraction x n rounding to 1) keeps its own. Pure jnp, static shapes; `fraction` may be traced.
  """
  if not adv_bt.shape == mask_bt.shape == turn_idx_bt.shape:
    raise ValueError(f"advantages {adv_bt.shape}, mask {mask_bt.shape} and turn ids {turn_idx_bt.shape} "
                     "differ in shape")
  if eligible_b is not None and tuple(eligible_b.shape) != adv_bt.shape[:1]:
    raise ValueError(f"eligible_b {tuple(eligible_b.shape)} is not one flag per row of advantages {adv_bt.shape}")
  if isinstance(fraction, (int, float)) and not 0.0 < fraction <= 1.0:
    raise ValueError(f"fraction={fraction}: the share of sessions shuffled must be in (0, 1]")
  dec_bt = (mask_bt > 0) & (turn_idx_bt == decision_turn)
  n_dec_b = dec_bt.sum(axis=1)
  has_b = n_dec_b > 0
  if eligible_b is not None:
    has_b = has_b & eligible_b.astype(bool)
  # d as the first decision token's value plus the mean offset from it: a turn whose tokens share
  # one value (GRPO, MS-GRPO, RLOO) hands on exactly that value, not a float sum / n of it.
  first_b = jnp.take_along_axis(adv_bt, jnp.argmax(dec_bt, axis=1)[:, None], axis=1)[:, 0]
  d_b = first_b + jnp.where(dec_bt, adv_bt - first_b[:, None], 0.0).sum(axis=1) / jnp.maximum(n_dec_b, 1)
  b = adv_bt.shape[0]
  order = jnp.argsort(jnp.where(has_b, jax.random.uniform(key, (b,)), 2.0))  # eligible rows first, random order
  rank_b = jnp.zeros((b,), jnp.int32).at[order].set(jnp.arange(b, dtype=jnp.int32))
  k = jnp.floor(fraction * has_b.sum() + 0.5).astype(jnp.int32)  # round half up: 0.5 x 2 rows -> 1
  drawn_b = has_b & (rank_b < k)
  donor_b = order[(rank_b + 1) % jnp.maximum(k, 1)]  # the next drawn row in the random order
  new_d_b = jnp.where(drawn_b, d_b[donor_b], d_b)
  return jnp.where(dec_bt & drawn_b[:, None], new_d_b[:, None].astype(adv_bt.dtype), adv_bt)
