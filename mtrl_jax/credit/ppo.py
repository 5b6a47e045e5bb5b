"""Per-token clipped policy objectives and their aggregation to a scalar.

Conventions: log-probs are per token, f32[B, T]; the old / proximal /
behaviour log-probs are constants (gradients stopped here). Every masked
token contributes exactly 0 to the loss and to its gradient, even if its
log-probs are garbage: log-ratios are zeroed before exp, not after.
"""
import jax
import jax.numpy as jnp

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")


def _log_ratio(logp_bt, ref_logp_bt, m):
  return jnp.where(m, logp_bt - jax.lax.stop_gradient(ref_logp_bt), 0.0)


def clipped_surrogate(ratio_bt, adv_bt, m, eps_low, eps_high, dual_clip=None):
  """-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), plus dual clip.

  Dual clip (for A < 0 only): the loss is capped at -c * A, i.e. ratios
  above c stop pushing down. Returns (loss_bt, flags) where flags holds the
  bool[B, T] masks clip_low / clip_high / dual_clip of tokens whose gradient
  the clipping removed.
  """
  # Equivalent mutant (another fill): masked tokens' loss is zeroed and their
  # flags masked below.
  adv = jnp.where(m, jax.lax.stop_gradient(adv_bt), 0.0)  # pragma: no mutate
  loss1 = -adv * ratio_bt
  loss2 = -adv * jnp.clip(ratio_bt, 1.0 - eps_low, 1.0 + eps_high)
  loss = jnp.maximum(loss1, loss2)
  flags = {
      "clip_low": m & (adv < 0) & (ratio_bt < 1.0 - eps_low),
      "clip_high": m & (adv > 0) & (ratio_bt > 1.0 + eps_high),
  }
  if dual_clip is not None:
    loss = jnp.where(adv < 0, jnp.minimum(loss, -dual_clip * adv), loss)
    flags["dual_clip"] = m & (adv < 0) & (ratio_bt > dual_clip)
  else:
    flags["dual_clip"] = jnp.zeros_like(m)
  return jnp.where(m, loss, 0.0), flags


def check_clip(eps_low, eps_high, dual_clip):
  if not (0 <= eps_low < 1 and eps_high >= 0):
    raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {eps_low}, {eps_high}")
  if dual_clip is not None and dual_clip <= 1.0:
    raise ValueError(f"dual_clip must be > 1, got {dual_clip!r}")


def ppo_clip_loss_bt(logp_bt, old_logp_bt, adv_bt, mask_bt, *, eps_low: float = 0.2,
                     eps_high: float = 0.28, dual_clip=None):
  """PPO clip with clip-higher (DAPO, arXiv 2503.14476). (loss_bt, flags)."""
  check_clip(eps_low, eps_high, dual_clip)
  m = mask_bt > 0
  ratio = jnp.exp(_log_ratio(logp_bt, old_logp_bt, m))
  loss, flags = clipped_surrogate(ratio, adv_bt, m, eps_low, eps_high, dual_clip)
  flags["ratio"] = ratio
  return loss, flags


def decoupled_ppo_loss_bt(logp_bt, prox_logp_bt, behav_logp_bt, adv_bt, mask_bt, *,
                          eps_low: float = 0.2, eps_high: float = 0.28,
                          dual_clip=None, behav_cap: float = 5.0):
  """Decoupled PPO for stale samples (AReaL, arXiv 2505.24298).

  u = pi / pi_prox is clipped; w = pi_prox / pi_behav weights the token;
  tokens with w > behav_cap are dropped (flags['keep'] is False there), not
  clipped. Returns (loss_bt, flags); loss_bt is 0 on dropped tokens. With
  prox == behav, w = 1 and this is `ppo_clip_loss_bt` with old = behav.
  """
  check_clip(eps_low, eps_high, dual_clip)
  if behav_cap is not None and behav_cap < 1.0:
    raise ValueError(f"behav_cap must be >= 1, got {behav_cap!r}")
  m = mask_bt > 0
  u = jnp.exp(_log_ratio(logp_bt, prox_logp_bt, m))
  w = jnp.exp(jnp.where(m, jax.lax.stop_gradient(prox_logp_bt - behav_logp_bt), 0.0))
  keep = m if behav_cap is None else m & (w <= behav_cap)
  loss, flags = clipped_surrogate(u, adv_bt, keep, eps_low, eps_high, dual_clip)
  flags.update(ratio=u, behav_weight=w, keep=keep)
  return jnp.where(keep, w * loss, 0.0), flags


def aggregate(loss_bt, mask_bt, mode: str = "token_mean", norm_len=None,
              segment_ids_bt=None) -> jax.Array:
  """Reduces a per-token loss to a scalar over mask-1 tokens.

  token_mean: sum over all tokens / their number (DAPO).
  seq_mean_token_mean: per row mean over its tokens, then mean over rows
    with at least one token (classic GRPO).
  seq_mean_token_sum: per row sum / norm_len (a constant, default T: Dr.
    GRPO's length-unbiased form), then mean over rows with tokens.
  segment_ids_bt: when several sequences share a row (packing), the
    sequence of each token (ids unique within a row); the per-sequence
    modes then treat each (row, segment) as a sequence. norm_len should be
    given then: the default T is the packed row length.
  """
  if mode not in AGGREGATIONS:
    raise ValueError(f"unknown aggregation {mode!r}; valid: {AGGREGATIONS}")
  m = mask_bt > 0
  loss = jnp.where(m, loss_bt, 0.0)
  if mode == "token_mean":
    return jnp.sum(loss) / jnp.maximum(jnp.sum(m), 1)
  if segment_ids_bt is not None:
    b, t = loss.shape
    # A flat id per (row, segment); ids in [0, T] (0 = padding) so b * (T + 1) + id is unique.
    # Equivalent mutants: without the dtypes the ids are int32 too (int64
    # with x64 on, which index the same segments).
    seg = jnp.asarray(segment_ids_bt, jnp.int32)  # pragma: no mutate
    rows = jnp.arange(b, dtype=jnp.int32)  # pragma: no mutate
    seg = jnp.clip(seg, 0, t)  # an id out of [0, T] must not reach another row's ids
    flat = (rows[:, None] * (t + 1) + seg).reshape(-1)
    n = b * (t + 1)
    seg_sum = jax.ops.segment_sum(loss.reshape(-1), flat, num_segments=n)
    seg_cnt = jax.ops.segment_sum(m.reshape(-1).astype(jnp.int32), flat, num_segments=n)
    # The same reduction as below, over segments instead of rows.
    per_seq = (seg_sum / jnp.maximum(seg_cnt, 1) if mode == "seq_mean_token_mean"
               else seg_sum / (t if norm_len is None else norm_len))
    seqs = seg_cnt > 0
    return jnp.sum(jnp.where(seqs, per_seq, 0.0)) / jnp.maximum(jnp.sum(seqs), 1)
  cnt_b = jnp.sum(m, axis=1)
  if mode == "seq_mean_token_mean":
    per_row = jnp.sum(loss, axis=1) / jnp.maximum(cnt_b, 1)
  else:
    denom = loss_bt.shape[1] if norm_len is None else norm_len
    per_row = jnp.sum(loss, axis=1) / denom
  rows = cnt_b > 0
  return jnp.sum(jnp.where(rows, per_row, 0.0)) / jnp.maximum(jnp.sum(rows), 1)
