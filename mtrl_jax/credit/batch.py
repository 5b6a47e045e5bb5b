"""The typed record every estimator reads: one row per training sample.

Shape letters: B = samples (rows), T = tokens per row.

Two layouts share this record:

* session layout: one row holds a whole session (all its turns, observation
  tokens masked out). `episode_id_b` is then unique per row.
* per-turn layout: one row holds one turn of a session (its prompt is either
  the full history or only the current observation; that choice belongs to
  the packer). Rows of the same session share `episode_id_b`.

Rows may also hold several consecutive turns; the only requirement is that a
turn's action tokens live in a single row. All id fields may be arbitrary
non-negative integers: estimators remap them to dense ranks inside jit.
"""
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from mtrl_jax.credit.segments import dense_rank


class CreditBatch(NamedTuple):
  """Rollout data as the credit-assignment code sees it.

  Attributes:
    reward_bt: f32[B, T]. The environment reward of each turn, placed on the
      last action token of that turn; 0 elsewhere. Rewards on tokens with
      loss mask 0 are ignored. Per-token penalties (KL, shaping) may be added
      on any action token.
    loss_mask_bt: f32/bool[B, T]. 1 on action tokens, 0 on observation,
      prompt and padding tokens. A row without any action token is padding
      and takes no part in group statistics.
    turn_idx_bt: int32[B, T]. Turn index (0-based, within the session) of each
      token; read only where the loss mask is 1.
    group_id_b: int32[B]. Rows of sessions started from the same task + seed.
    episode_id_b: int32[B]. The session a row belongs to. Group statistics
      count each session once, however many rows it spans.
    tree_id_b: int32[B]. Sessions sharing a tree root (Tree-GRPO); for chain
      rollouts give each session its own id.
    return_b: f32[B]. The session's return (same value on every row of a
      session; the lowest-index row of each session is read).
    value_bt: optional f32[B, T]. Critic value at each token; None = zeros.
    state_id_bt: optional int32[B, T]. The anchor state of each token's turn:
      an id of the environment state the turn's action was taken in (equal
      ids = the same state; any int values, remapped inside), the same on
      every token of the turn, read where the loss mask is 1; < 0 = the env
      gave no key. Only the step-group estimators (gigpo, hgpo) read it.
    turn_reward_bt: optional f32[B, T]. A verifiable per-turn signal the env
      reports beside its reward (e.g. 1 for a valid action), on the turn's
      last action token like `reward_bt`; it is not part of the return.
      Read by mt_grpo (and progress's grounding term); None = zeros.
    progress_bt: optional f32[B, T]. A learned progress head's share of the
      episode's return for each turn, on the turn's last action token. Read
      by the progress estimator only.
  """

  reward_bt: jax.Array
  loss_mask_bt: jax.Array
  turn_idx_bt: jax.Array
  group_id_b: jax.Array
  episode_id_b: jax.Array
  tree_id_b: jax.Array
  return_b: jax.Array
  value_bt: Optional[jax.Array] = None
  state_id_bt: Optional[jax.Array] = None
  turn_reward_bt: Optional[jax.Array] = None
  progress_bt: Optional[jax.Array] = None

  @property
  def shape(self):
    return self.reward_bt.shape


def make_credit_batch(reward_bt,
                      loss_mask_bt,
                      turn_idx_bt=None,
                      group_id_b=None,
                      episode_id_b=None,
                      tree_id_b=None,
                      return_b=None,
                      value_bt=None,
                      state_id_bt=None,
                      turn_reward_bt=None,
                      progress_bt=None) -> CreditBatch:
  """Builds a `CreditBatch`, filling the optional fields with defaults.

  Defaults: turn 0 everywhere, one group for the whole batch, one episode
  and one tree per row, and `return_b` = the sum of action-token rewards of
  each episode (over all its rows); the optional per-turn fields (values,
  state ids, turn rewards, progress shares) stay None. Safe to call under jit.
  """
  reward_bt = jnp.asarray(reward_bt, jnp.float32)
  b, t = reward_bt.shape
  mask_bt = jnp.asarray(loss_mask_bt, jnp.float32)
  if turn_idx_bt is None:
    turn_idx_bt = jnp.zeros((b, t), jnp.int32)
  rows = jnp.arange(b, dtype=jnp.int32)
  group_id_b = jnp.zeros((b,), jnp.int32) if group_id_b is None else group_id_b
  episode_id_b = rows if episode_id_b is None else episode_id_b
  tree_id_b = rows if tree_id_b is None else tree_id_b
  episode_id_b = jnp.asarray(episode_id_b, jnp.int32)
  if return_b is None:
    ep = dense_rank(episode_id_b)
    row_sum = jnp.sum(jnp.where(mask_bt > 0, reward_bt, 0.0), axis=1)
    return_b = jax.ops.segment_sum(row_sum, ep, num_segments=b)[ep]
  return CreditBatch(
      reward_bt=reward_bt,
      loss_mask_bt=mask_bt,
      turn_idx_bt=jnp.asarray(turn_idx_bt, jnp.int32),
      group_id_b=jnp.asarray(group_id_b, jnp.int32),
      episode_id_b=episode_id_b,
      tree_id_b=jnp.asarray(tree_id_b, jnp.int32),
      return_b=jnp.asarray(return_b, jnp.float32),
      value_bt=None if value_bt is None else jnp.asarray(value_bt, jnp.float32),
      state_id_bt=None if state_id_bt is None else jnp.asarray(state_id_bt, jnp.int32),
      turn_reward_bt=None if turn_reward_bt is None else jnp.asarray(turn_reward_bt, jnp.float32),
      progress_bt=None if progress_bt is None else jnp.asarray(progress_bt, jnp.float32),
  )


def values_or_zeros(batch: CreditBatch) -> jax.Array:
  if batch.value_bt is None:
    return jnp.zeros_like(batch.reward_bt)
  return batch.value_bt
