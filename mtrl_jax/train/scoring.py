"""The learner's scoring step: a packed batch's log-probs and values, once, before the update's epochs.

The proximal log-probs (decoupled PPO's anchor), the reference policy's
log-probs (KL) and the critic's values are computed by one forward of the
learner's current state, on one sample per row or (with a row plan) on packed
rows, and returned in the batch's one-sample-per-row layout as host arrays.
`sampler_mismatch` compares the proximal log-probs with the sampler's.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import numpy as np

from mtrl_jax.parallel.batch import put_global_batch
from mtrl_jax.parallel.sharded_step import sharding_context
from mtrl_jax.rollout.packing import PackedBatch
from mtrl_jax.rollout.row_packing import RowPlan, pack_rows, unpack_rows


class Scored(NamedTuple):
  """[B, T] host arrays of a packed batch, scored by the learner's current state."""
  prox_logp_bt: np.ndarray
  ref_logp_bt: np.ndarray  # zeros without a reference policy
  values_bt: np.ndarray  # zeros without a critic


def score(score_fn: Callable, policy, critic, ref, pb: PackedBatch, plan: Optional[RowPlan], *, mesh, rules,
          pad_id: int) -> Scored:
  """`score_fn` (the learner's ScoreProgram) on `pb`'s rows, or on the packed rows of `plan`
  (attention kept inside each segment) unpacked to pb's layout (0 beyond each sample's length).

  Every host holds the whole batch (sessions are gathered from all hosts before the update)
  and feeds the rows of its own devices; the outputs are replicated.
  """
  with sharding_context(mesh, rules):
    if plan is None:
      rows = (pb.tokens_bt, pb.targets_bt, pb.positions_bt)
    else:
      rows = (pack_rows(pb.tokens_bt, plan, pad_id), pack_rows(pb.targets_bt, plan, pad_id),
              pack_rows(pb.positions_bt, plan), plan.segment_ids_rl)
    out = jax.device_get(score_fn(policy, critic, ref, *put_global_batch(rows, mesh, rules)))
  if plan is None:
    return Scored(*(np.asarray(x) for x in out))
  return Scored(*(unpack_rows(x, plan, pb.tokens_bt.shape[1]) for x in out))


MISMATCH_RATIO_BAND = (0.9, 1.1)


def sampler_mismatch(prox_logp_bt, behav_logp_bt, loss_mask_bt, version_bt, version: int) -> dict:
  """Trainer/sampler mismatch: |behaviour log-prob - learner's log-prob| on the
  generated tokens of the CURRENT policy version (same weights on both sides).

  The sampler (cached decode, one token at a time) and the learner (one
  cache-free forward of the whole row) compute the same function with
  different kernels and summation orders: in float32 the gap is float noise
  (~1e-6); in bfloat16 it is what decoupled-PPO ratios and IS caps absorb.
  Tokens of older versions are left out (their gap is staleness, not numerics).
  Only meaningful at temperature 1 without top-k/top-p (the behaviour
  log-prob is that of the distribution actually sampled).
  """
  cur = (np.asarray(loss_mask_bt) > 0) & (np.asarray(version_bt) == int(version))
  diff = (np.asarray(prox_logp_bt, np.float64) - np.asarray(behav_logp_bt, np.float64))[cur]
  gap = np.abs(diff)
  # The share of tokens whose importance ratio pi_learner / pi_sampler leaves
  # [0.9, 1.1] (the band TRL reports: 7.5% between vLLM and a bf16 trainer).
  lo, hi = MISMATCH_RATIO_BAND
  out_of_band = (diff < np.log(lo)) | (diff > np.log(hi))
  return {"mismatch/logp_abs_mean": float(gap.mean()) if gap.size else 0.0,
          "mismatch/logp_abs_max": float(gap.max()) if gap.size else 0.0,
          "mismatch/ratio_out_share": float(out_of_band.mean()) if gap.size else 0.0,
          "mismatch/tokens": float(gap.size)}


def scored_stats(scored: Scored, pb: PackedBatch, version: int) -> dict:
  """The scoring step's metrics: the sampler mismatch, and the largest proximal / behaviour ratio."""
  out = sampler_mismatch(scored.prox_logp_bt, pb.behav_logp_bt, pb.loss_mask_bt, pb.version_bt, version)
  ratio = np.exp(np.asarray(scored.prox_logp_bt) - pb.behav_logp_bt)
  m = np.asarray(pb.loss_mask_bt) > 0
  out["update/ratio_prox_behav_max"] = float(np.max(np.where(m, ratio, 0.0))) if m.any() else 0.0
  return out
