"""A float64 numpy reference of credit/ppo.py, losses.py, regularizers.py,
diagnostics.py and token_mask.py, written from the formulas in their
docstrings (and docs/credit.md), with plain loops where the code vectorises.

Imported by name by the oracle tests (tests/credit is on sys.path under
pytest's default import mode). Nothing here calls mtrl_jax.
"""
import math
from fractions import Fraction

import numpy as np


def log_ratio(logp, ref, m):
  return np.where(m, logp - ref, 0.0)


def surrogate(ratio, adv, m, eps_low, eps_high, dual_clip):
  """-min(r A, clip(r) A), dual clip for A < 0; 0 off the mask. (loss, flags)."""
  a = np.where(m, adv, 0.0)
  loss = np.zeros_like(ratio)
  flags = {k: np.zeros(ratio.shape, bool) for k in ("clip_low", "clip_high", "dual_clip")}
  for idx in np.ndindex(ratio.shape):
    if not m[idx]:
      continue
    r, x = ratio[idx], a[idx]
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    v = max(-x * r, -x * min(max(r, lo), hi))
    if dual_clip is not None and x < 0:
      v = min(v, -dual_clip * x)
      flags["dual_clip"][idx] = r > dual_clip
    loss[idx] = v
    flags["clip_low"][idx] = x < 0 and r < lo
    flags["clip_high"][idx] = x > 0 and r > hi
  return loss, flags


def ppo_terms(logp, behav, adv, mask, *, eps_low, eps_high, dual_clip, prox=None,
              behav_cap=5.0):
  """Per-token PPO (or decoupled PPO when prox is given): (loss_bt, flags)."""
  m = mask > 0
  if prox is None:
    ratio = np.exp(log_ratio(logp, behav, m))
    loss, flags = surrogate(ratio, adv, m, eps_low, eps_high, dual_clip)
    flags["ratio"], flags["keep"], flags["behav_weight"] = ratio, m, np.ones_like(ratio)
    return loss, flags
  u = np.exp(log_ratio(logp, prox, m))
  w = np.exp(np.where(m, prox - behav, 0.0))
  keep = m if behav_cap is None else m & (w <= behav_cap)
  loss, flags = surrogate(u, adv, keep, eps_low, eps_high, dual_clip)
  flags.update(ratio=u, behav_weight=w, keep=keep)
  return np.where(keep, w * loss, 0.0), flags


def sequences(mask, segment_ids):
  """Lists of (row, column) index lists, one per sequence (row or (row, segment))."""
  b, t = mask.shape
  out = []
  for i in range(b):
    if segment_ids is None:
      out.append([(i, j) for j in range(t)])
    else:
      for s in sorted(set(segment_ids[i].tolist())):
        out.append([(i, j) for j in range(t) if segment_ids[i, j] == s])
  return out


def aggregate(loss, mask, mode="token_mean", norm_len=None, segment_ids=None):
  m = mask > 0
  if mode == "token_mean":
    n = int(m.sum())
    return float(np.where(m, loss, 0.0).sum()) / max(n, 1)
  t = loss.shape[1]
  per_seq = []
  for seq in sequences(m, segment_ids):
    toks = [loss[ij] for ij in seq if m[ij]]
    if not toks:
      continue  # a sequence without tokens is not counted
    if mode == "seq_mean_token_mean":
      per_seq.append(sum(toks) / len(toks))
    else:
      per_seq.append(sum(toks) / (t if norm_len is None else norm_len))
  return sum(per_seq) / max(len(per_seq), 1)


def masked_mean(x, m):
  m = m > 0
  return float(np.where(m, x, 0.0).sum()) / max(int(m.sum()), 1)


def masked_var(x, m):
  mu = masked_mean(x, m)
  return masked_mean((x - mu) ** 2, m)


def explained_variance(pred, target, m):
  vt = masked_var(target, m)
  return 0.0 if vt <= 0 else 1.0 - masked_var(target - pred, m) / vt


def per_turn_mean_std(x, turn, mask, k):
  mean, std, cnt = np.zeros(k), np.zeros(k), np.zeros(k)
  for j in range(k):
    sel = (mask > 0) & (turn == j)
    if sel.any():
      vals = x[sel]
      mean[j], std[j], cnt[j] = vals.mean(), vals.std(), sel.sum()
  return mean, std, cnt


def kl(logp, ref, mask, kind):
  m = mask > 0
  d = np.where(m, ref - logp, 0.0)
  out = -d if kind == "k1" else np.exp(d) - d - 1.0
  return np.where(m, out, 0.0)


def entropy(logits):
  z = logits - logits.max(-1, keepdims=True)
  p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
  logp = np.log(np.maximum(p, 1e-300))
  return -(np.where(p > 0, p * logp, 0.0)).sum(-1)


def top_entropy(ent, mask, rho):
  """ceil(rho N) highest-entropy valid tokens, ties to the earlier (row-major) one."""
  m = (mask > 0).reshape(-1)
  e = ent.reshape(-1)
  valid = [i for i in range(len(e)) if m[i]]
  order = sorted(valid, key=lambda i: (-e[i], i))
  k = math.ceil(Fraction(rho).limit_denominator(10_000) * len(valid))
  keep = np.zeros(len(e), bool)
  keep[order[:k]] = True
  return keep.reshape(ent.shape)


def policy_loss(cfg, logp, behav, adv, mask, *, prox=None, ref=None, ent=None, turn=None,
                success=None, segment_ids=None):
  """The loss and every diagnostic of `mtrl_jax.credit.policy_loss`, in float64."""
  m = mask > 0
  pg_bt, flags = ppo_terms(logp, behav, adv, mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                           dual_clip=cfg.dual_clip, prox=prox, behav_cap=cfg.behav_cap)
  keep = flags["keep"]
  cap_dropped = m & ~keep
  ent_dropped = np.zeros_like(m)
  if cfg.entropy_top_rho is not None:
    top = top_entropy(ent, mask, cfg.entropy_top_rho)
    ent_dropped = m & ~top
    keep = keep & top

  def agg(x, mm):
    return aggregate(x, mm, cfg.agg, cfg.norm_len, segment_ids)

  pg = agg(pg_bt, keep)
  loss = pg
  diag = {"pg_loss": pg}
  if ref is not None:
    diag["kl_ref"] = agg(kl(logp, ref, mask, cfg.kl_kind), m)
    loss += cfg.kl_coef * diag["kl_ref"]
  if ent is not None:
    diag["entropy"] = agg(ent, m)
    loss -= cfg.ent_coef * diag["entropy"]
  if cfg.nll_coef != 0.0:
    ok = np.asarray(success) > 0
    nm = m & (ok if ok.ndim == 2 else ok[:, None])
    diag["nll"] = agg(-np.where(nm, logp, 0.0), nm)
    loss += cfg.nll_coef * diag["nll"]
  r = flags["ratio"]
  diag.update(
      loss=loss,
      clip_frac_low=masked_mean(flags["clip_low"].astype(float), m),
      clip_frac_high=masked_mean(flags["clip_high"].astype(float), m),
      dual_clip_frac=masked_mean(flags["dual_clip"].astype(float), m),
      approx_kl=masked_mean(r - 1.0 - np.log(np.maximum(r, 1e-30)), m),
      masked_frac_cap=masked_mean(cap_dropped.astype(float), m),
      masked_frac_entropy=masked_mean(ent_dropped.astype(float), m),
      adv_mean=masked_mean(adv, m),
      adv_std=math.sqrt(masked_var(adv, m)),
      num_tokens=float(m.sum()),
  )
  if turn is not None:
    diag["adv_mean_by_turn"], diag["adv_std_by_turn"], _ = per_turn_mean_std(adv, turn, mask,
                                                                              cfg.max_turns)
  return loss, diag


def value_loss(v, old, tgt, mask, clip_eps=0.2, agg="token_mean", norm_len=None,
               segment_ids=None):
  m = mask > 0
  per_tok = np.zeros(v.shape)
  clipped = np.zeros(v.shape, bool)
  for idx in np.ndindex(v.shape):
    if not m[idx]:
      continue
    err = (v[idx] - tgt[idx]) ** 2
    if clip_eps is None:
      per_tok[idx] = 0.5 * err
      continue
    vc = min(max(v[idx], old[idx] - clip_eps), old[idx] + clip_eps)
    err_c = (vc - tgt[idx]) ** 2
    per_tok[idx] = 0.5 * max(err, err_c)
    clipped[idx] = err_c > err
  loss = aggregate(per_tok, mask, agg, norm_len, segment_ids)
  vm = np.where(m, v, 0.0)
  tm = np.where(m, tgt, 0.0)
  return loss, {
      "value_loss": loss,
      "value_clip_frac": masked_mean(clipped.astype(float), m),
      "explained_variance": explained_variance(vm, tm, m),
      "value_mean": masked_mean(vm, m),
      "target_mean": masked_mean(tm, m),
  }
