"""The combined policy loss and the clipped value loss, with diagnostics.

`policy_loss` = PPO-clip (plain or decoupled) on the kept tokens
  + kl_coef * KL(pi || pi_ref) + nll_coef * NLL(successful sessions)
  - ent_coef * entropy,
each term aggregated with `cfg.agg` over its own token mask. The kept
tokens of the policy-gradient term are the action tokens minus those
dropped by the behaviour cap (decoupled PPO) and, if `entropy_top_rho` is
set, minus those outside the batch-wide top-rho entropy set; they form both
numerator and denominator of the aggregation.
"""
import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp

from mtrl_jax.credit import diagnostics as dg
from mtrl_jax.credit.ppo import (AGGREGATIONS, aggregate, check_clip,
                                 decoupled_ppo_loss_bt, ppo_clip_loss_bt)
from mtrl_jax.credit.regularizers import KL_KINDS, kl_estimate, nll_mask
from mtrl_jax.credit.token_mask import high_entropy_mask


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  """Static settings of `policy_loss` (hashable: usable as a jit static arg).

  eps_low / eps_high: clip range of the ratio (DAPO clip-higher).
  dual_clip: c > 1 caps the loss of A < 0 tokens at -c * A; None = off.
  agg: 'token_mean' | 'seq_mean_token_mean' | 'seq_mean_token_sum'.
  norm_len: the constant divisor of 'seq_mean_token_sum' (None = T).
  behav_cap: decoupled PPO drops tokens with pi_prox / pi_behav above it.
  kl_coef, kl_kind: KL-to-reference loss term ('k1' or 'k3'); 0 = off.
  ent_coef: entropy bonus coefficient (subtracted from the loss).
  entropy_top_rho: keep only this top fraction of tokens by entropy in the
    policy-gradient term (forking tokens, 0.2 in the paper); None = all.
  nll_coef: VAPO's mu, weight of the NLL of successful sessions' tokens.
  max_turns: size of the per-turn advantage statistics in the diagnostics.
  """

  eps_low: float = 0.2
  eps_high: float = 0.28
  dual_clip: Optional[float] = None
  agg: str = "token_mean"
  norm_len: Optional[int] = None
  behav_cap: Optional[float] = 5.0
  kl_coef: float = 0.0
  kl_kind: str = "k3"
  ent_coef: float = 0.0
  entropy_top_rho: Optional[float] = None
  nll_coef: float = 0.0
  max_turns: int = 16

  def __post_init__(self):
    check_clip(self.eps_low, self.eps_high, self.dual_clip)
    if self.agg not in AGGREGATIONS:
      raise ValueError(f"unknown aggregation {self.agg!r}; valid: {AGGREGATIONS}")
    if self.kl_kind not in KL_KINDS:
      raise ValueError(f"unknown KL kind {self.kl_kind!r}; valid: {KL_KINDS}")
    if self.behav_cap is not None and self.behav_cap < 1.0:
      raise ValueError(f"behav_cap must be >= 1, got {self.behav_cap!r}")
    if self.entropy_top_rho is not None and not 0.0 < self.entropy_top_rho <= 1.0:
      raise ValueError(f"entropy_top_rho must lie in (0, 1], got {self.entropy_top_rho!r}")
    if self.norm_len is not None and self.norm_len <= 0:
      raise ValueError(f"norm_len must be positive, got {self.norm_len!r}")
    if self.max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {self.max_turns!r}")


def policy_loss(cfg: PolicyLossConfig, logp_bt, behav_logp_bt, adv_bt, mask_bt, *,
                prox_logp_bt=None, ref_logp_bt=None, entropy_bt=None,
                turn_idx_bt=None, success_b=None, segment_ids_bt=None):
  """Policy loss and its diagnostics.

  Args:
    cfg: `PolicyLossConfig`.
    logp_bt: log pi_theta of the sampled tokens (differentiated).
    behav_logp_bt: log-probs recorded by the actor that sampled the tokens.
      Without `prox_logp_bt` this is PPO's pi_old.
    adv_bt: advantages (treated as constants).
    mask_bt: 1 on action tokens.
    prox_logp_bt: log-probs recomputed by the learner before the update;
      given, the loss is decoupled PPO.
    ref_logp_bt: reference-policy log-probs (needed when kl_coef > 0).
    entropy_bt: per-token entropy of pi_theta, differentiable (needed when
      ent_coef > 0 or entropy_top_rho is set). Per token rather than logits
      so the caller can compute it in vocabulary chunks.
    turn_idx_bt: turn index per token, for the per-turn advantage stats.
    success_b: success flag per row [B], or per token [B, T] when rows
      hold several sessions (needed when nll_coef > 0).
    segment_ids_bt: the sequence of each token when several share a row
      (packing); the per-sequence aggregations then count segments, not rows.

  Returns:
    (loss scalar, diagnostics dict of scalars and [max_turns] arrays).
  """
  m = mask_bt > 0
  if prox_logp_bt is None:
    pg_bt, flags = ppo_clip_loss_bt(logp_bt, behav_logp_bt, adv_bt, m,
                                    eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                                    dual_clip=cfg.dual_clip)
    keep = m
  else:
    pg_bt, flags = decoupled_ppo_loss_bt(logp_bt, prox_logp_bt, behav_logp_bt, adv_bt, m,
                                         eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                                         dual_clip=cfg.dual_clip, behav_cap=cfg.behav_cap)
    keep = flags["keep"]
  cap_dropped = m & ~keep

  needs_entropy = cfg.ent_coef != 0.0 or cfg.entropy_top_rho is not None
  if needs_entropy and entropy_bt is None:
    raise ValueError("ent_coef / entropy_top_rho need entropy_bt")
  ent_dropped = jnp.zeros_like(m)
  if cfg.entropy_top_rho is not None:
    top = high_entropy_mask(entropy_bt, m, cfg.entropy_top_rho)
    ent_dropped = m & ~top
    keep = keep & top

  agg = functools.partial(aggregate, mode=cfg.agg, norm_len=cfg.norm_len,
                          segment_ids_bt=segment_ids_bt)
  pg = agg(pg_bt, keep)
  loss = pg
  diag = {"pg_loss": pg}
  if cfg.kl_coef != 0.0:
    if ref_logp_bt is None:
      raise ValueError("kl_coef != 0 needs ref_logp_bt")
  if ref_logp_bt is not None:
    kl = agg(kl_estimate(logp_bt, ref_logp_bt, m, cfg.kl_kind), m)
    diag["kl_ref"] = kl
    if cfg.kl_coef != 0.0:
      loss = loss + cfg.kl_coef * kl
  if entropy_bt is not None:
    ent = agg(entropy_bt, m)
    diag["entropy"] = jax.lax.stop_gradient(ent)
    if cfg.ent_coef != 0.0:
      loss = loss - cfg.ent_coef * ent
  if cfg.nll_coef != 0.0:
    if success_b is None:
      raise ValueError("nll_coef != 0 needs success_b")
    nm = nll_mask(m, success_b)
    nll = agg(-jnp.where(nm, logp_bt, 0.0), nm)
    diag["nll"] = nll
    loss = loss + cfg.nll_coef * nll

  log_r = jnp.log(jnp.maximum(flags["ratio"], 1e-30))
  approx_kl = dg.masked_mean(jax.lax.stop_gradient(flags["ratio"] - 1.0 - log_r), m)
  adv = jax.lax.stop_gradient(adv_bt)
  diag.update(
      loss=loss,
      clip_frac_low=dg.masked_fraction(flags["clip_low"], m),
      clip_frac_high=dg.masked_fraction(flags["clip_high"], m),
      dual_clip_frac=dg.masked_fraction(flags["dual_clip"], m),
      approx_kl=approx_kl,
      masked_frac_cap=dg.masked_fraction(cap_dropped, m),
      masked_frac_entropy=dg.masked_fraction(ent_dropped, m),
      adv_mean=dg.masked_mean(adv, m),
      adv_std=jnp.sqrt(dg.masked_var(adv, m)),
      num_tokens=jnp.sum(m).astype(jnp.float32),
  )
  if turn_idx_bt is not None:
    mean_k, std_k, _ = dg.per_turn_mean_std(adv, turn_idx_bt, m, cfg.max_turns)
    diag.update(adv_mean_by_turn=mean_k, adv_std_by_turn=std_k)
  return loss, diag


def value_loss(value_bt, old_value_bt, target_bt, mask_bt, *, clip_eps: Optional[float] = 0.2,
               agg: str = "token_mean", norm_len=None, segment_ids_bt=None):
  """0.5 * max((V - Vt)^2, (clip(V, Vold - eps, Vold + eps) - Vt)^2), masked.

  clip_eps=None gives the plain 0.5 * (V - Vt)^2. Returns (loss, diagnostics)
  with the explained variance of the targets by V and the clip fraction.
  """
  m = mask_bt > 0
  # Equivalent mutant (another fill): off the mask v = tgt, so err = 0 there,
  # and every statistic below is masked.
  tgt = jax.lax.stop_gradient(jnp.where(m, target_bt, 0.0))  # pragma: no mutate
  v = jnp.where(m, value_bt, tgt)
  err = jnp.square(v - tgt)
  if clip_eps is None:
    per_tok = 0.5 * err
    clipped = jnp.zeros_like(m)
  else:
    old = jax.lax.stop_gradient(jnp.where(m, old_value_bt, tgt))
    v_clip = jnp.clip(v, old - clip_eps, old + clip_eps)
    err_clip = jnp.square(v_clip - tgt)
    per_tok = 0.5 * jnp.maximum(err, err_clip)
    clipped = m & (err_clip > err)
  loss = aggregate(per_tok, m, agg, norm_len, segment_ids_bt)
  diag = {
      "value_loss": loss,
      "value_clip_frac": dg.masked_fraction(clipped, m),
      "explained_variance": dg.explained_variance(jax.lax.stop_gradient(v), tgt, m),
      "value_mean": dg.masked_mean(jax.lax.stop_gradient(v), m),
      "target_mean": dg.masked_mean(tgt, m),
  }
  return loss, diag


def nll_loss(logp_bt, mask_bt, success_b, agg: str = "token_mean", norm_len=None,
             segment_ids_bt=None):
  """VAPO's L_NTP: negative log-likelihood of successful sessions' tokens."""
  nm = nll_mask(mask_bt, success_b)
  return aggregate(-jnp.where(nm, logp_bt, 0.0), nm, agg, norm_len, segment_ids_bt)
