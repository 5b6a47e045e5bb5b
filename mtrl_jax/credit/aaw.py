"""Absolute-advantage-weighted (AAW) episode sampling for MS-GRPO.

arXiv 2508.10839 subsamples episodes in proportion to |A|; the exact form is
not pinned down there, so this is what mtrl_jax implements:

  p_e = (|A_e| + floor) / sum_valid (|A_e'| + floor)   over valid episodes,
  uniform over valid episodes if every weight is 0,

and a draw of `num` distinct episodes by the Gumbel-top-k trick, which
equals drawing one episode at a time from p without replacement
(renormalising after each draw). Episodes with p_e = 0 are never drawn;
if fewer than `num` have p_e > 0, the extra slots come back flagged
invalid.
"""
import jax
import jax.numpy as jnp

from mtrl_jax.credit.batch import CreditBatch
from mtrl_jax.credit.outcome import episode_group_advantage


def aaw_probabilities(adv_e, valid_e, floor: float = 0.0) -> jax.Array:
  """Sampling probabilities proportional to |A_e| + floor over valid slots."""
  w = jnp.where(valid_e, jnp.abs(adv_e) + floor, 0.0)
  # Equivalent mutant: a bool array promotes to the same float weights below.
  uniform = valid_e.astype(jnp.float32)  # pragma: no mutate
  total = jnp.sum(w)
  w = jnp.where(total > 0, w, uniform)
  return w / jnp.maximum(jnp.sum(w), 1e-30)


def aaw_sample(key, batch: CreditBatch, num: int, *, floor: float = 0.0,
               eps: float = 1e-6, scale_by_std: bool = True, ddof: int = 0):
  """Draws `num` (static, <= B) episodes of `batch` with AAW probabilities.

  A_e is the MS-GRPO / GRPO episode advantage with the given options.
  Returns (row_keep_b bool[B]: rows of the drawn episodes,
  episode_slot_n int32[num], slot_ok_n bool[num], probs_e f32[B]).
  Episode slots are the dense ranks of `episode_id_b`.
  """
  adv_e, table = episode_group_advantage(batch, eps=eps, scale_by_std=scale_by_std,
                                         ddof=ddof)
  probs = aaw_probabilities(adv_e, table.valid_e, floor)
  logits = jnp.where(probs > 0, jnp.log(jnp.maximum(probs, 1e-30)), -jnp.inf)
  scores = logits + jax.random.gumbel(key, probs.shape)
  _, slots = jax.lax.top_k(scores, num)
  ok = probs[slots] > 0
  drawn_e = jnp.zeros(probs.shape, jnp.int32).at[slots].max(ok.astype(jnp.int32)) > 0
  # Equivalent mutant: lax.top_k's indices are int32 already.
  return drawn_e[table.ep_b], slots.astype(jnp.int32), ok, probs  # pragma: no mutate
