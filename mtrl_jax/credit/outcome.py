"""Outcome-level estimators: one scalar per session, spread over its tokens.

All of them work on the episode table, so they read each session's return
once even when the session is split over several rows (per-turn layout), and
every action token of every row of a session gets the same advantage. They
involve no critic: the value target they return is None.
"""
import jax
import jax.numpy as jnp

from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.credit.segments import (dense_rank, episode_table, per_episode,
                                      segment_normalize)

MS_GRPO_CONTEXTS = ("history", "markov")


def _spread(adv_e: jax.Array, ep_b: jax.Array, batch: CreditBatch) -> jax.Array:
  adv_b = adv_e[ep_b]
  return jnp.where(batch.loss_mask_bt > 0, adv_b[:, None], 0.0)


def _check_ddof(ddof):
  if ddof not in (0, 1):
    raise ValueError(f"ddof must be 0 or 1, got {ddof!r}")


def episode_group_advantage(batch: CreditBatch,
                            *,
                            eps: float = 1e-6,
                            scale_by_std: bool = True,
                            ddof: int = 0):
  """(R_i - mean_g R) / (std_g R + eps) per episode slot.

  Returns (adv_e f32[B], table) where adv_e[e] belongs to episode slot e
  (see `segments.EpisodeTable`); empty slots hold 0.
  """
  _check_ddof(ddof)
  b = batch.return_b.shape[0]
  table = episode_table(batch.episode_id_b, batch.loss_mask_bt)
  ret_e = per_episode(batch.return_b, table)
  grp_e = per_episode(dense_rank(batch.group_id_b), table)
  adv_e = segment_normalize(ret_e, grp_e, table.valid_e, b, eps, scale_by_std, ddof)
  return adv_e, table


def grpo(batch: CreditBatch, *, eps: float = 1e-6, scale_by_std: bool = True,
         ddof: int = 0):
  """GRPO outcome advantage (arXiv 2402.03300) on every action token.

  A_i = (R_i - mean_g R) / (std_g R + eps), std with `ddof` (0: population).
  `scale_by_std=False` gives the Dr. GRPO variant (no std division).
  """
  adv_e, table = episode_group_advantage(
      batch, eps=eps, scale_by_std=scale_by_std, ddof=ddof)
  return _spread(adv_e, table.ep_b, batch), None


def ms_grpo(batch: CreditBatch, *, eps: float = 1e-6, scale_by_std: bool = True,
            ddof: int = 0, context: str = "markov"):
  """Multi-Step GRPO (arXiv 2508.10839): the episode's group-normalised
  return is the advantage of every turn of the episode.

  Meant for the per-turn layout (rows sharing `episode_id_b`), works equally
  on whole sessions. `context` records how the packer built each turn's
  prompt ('markov': current observation only, the paper's setting;
  'history': full transcript); it does not change the arithmetic.
  """
  if context not in MS_GRPO_CONTEXTS:
    raise ValueError(f"context must be one of {MS_GRPO_CONTEXTS}, got {context!r}")
  return grpo(batch, eps=eps, scale_by_std=scale_by_std, ddof=ddof)


def rloo(batch: CreditBatch):
  """Leave-one-out baseline: A_i = R_i - mean_{j != i in group} R_j.

  A session alone in its group gets 0 (no baseline exists).
  """
  b = batch.return_b.shape[0]
  table = episode_table(batch.episode_id_b, batch.loss_mask_bt)
  ret_e = jnp.where(table.valid_e, per_episode(batch.return_b, table), 0.0)
  grp_e = per_episode(dense_rank(batch.group_id_b), table)
  # Equivalent mutants: astype's default dtype (None) is float32 too.
  w = table.valid_e.astype(jnp.float32)  # pragma: no mutate
  cnt = jax.ops.segment_sum(w, grp_e, num_segments=b)[grp_e]
  tot = jax.ops.segment_sum(ret_e, grp_e, num_segments=b)[grp_e]
  others = (tot - ret_e) / jnp.maximum(cnt - 1.0, 1.0)
  adv_e = jnp.where(table.valid_e & (cnt > 1.0), ret_e - others, 0.0)
  return _spread(adv_e, table.ep_b, batch), None


def tree(batch: CreditBatch, *, eps: float = 1e-6, scale_by_std: bool = True,
         ddof: int = 0):
  """Tree-GRPO (arXiv 2509.21240): A = norm_group(R) + norm_tree(R).

  Each term is (R - mean) / (std + eps) over the sessions of the same group
  (task) and of the same tree (root) respectively.
  """
  _check_ddof(ddof)
  b = batch.return_b.shape[0]
  table = episode_table(batch.episode_id_b, batch.loss_mask_bt)
  ret_e = per_episode(batch.return_b, table)
  grp_e = per_episode(dense_rank(batch.group_id_b), table)
  tree_e = per_episode(dense_rank(batch.tree_id_b), table)
  adv_e = (segment_normalize(ret_e, grp_e, table.valid_e, b, eps, scale_by_std, ddof)
           + segment_normalize(ret_e, tree_e, table.valid_e, b, eps, scale_by_std, ddof))
  return _spread(adv_e, table.ep_b, batch), None
