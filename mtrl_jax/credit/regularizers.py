"""KL to a reference policy, entropy and the VAPO NLL term, per token."""
import jax
import jax.numpy as jnp

KL_KINDS = ("k1", "k3")


def kl_estimate(logp_bt, ref_logp_bt, mask_bt, kind: str = "k3") -> jax.Array:
  """Per-token estimate of KL(pi || pi_ref) from samples of pi.

  k1 = log pi - log pi_ref; k3 = exp(log pi_ref - log pi) - (log pi_ref -
  log pi) - 1 (non-negative, low variance). 0 on masked tokens.
  """
  if kind not in KL_KINDS:
    raise ValueError(f"unknown KL kind {kind!r}; valid: {KL_KINDS}")
  m = mask_bt > 0
  d = jnp.where(m, jax.lax.stop_gradient(ref_logp_bt) - logp_bt, 0.0)
  kl = -d if kind == "k1" else jnp.exp(d) - d - 1.0
  return jnp.where(m, kl, 0.0)


def kl_reward_penalty(reward_bt, logp_bt, ref_logp_bt, mask_bt, *, coef: float,
                      kind: str = "k1") -> jax.Array:
  """reward - coef * KL on every action token (no gradient flows).

  For the token-level critic estimators (gae, bilevel_gae); outcome
  estimators read `return_b` and would not see the penalty.
  """
  kl = kl_estimate(jax.lax.stop_gradient(logp_bt), ref_logp_bt, mask_bt, kind)
  return reward_bt - coef * kl


def entropy_from_logits(logits_btv) -> jax.Array:
  """Entropy of the softmax over the last axis, f32[B, T]."""
  logp = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def nll_mask(mask_bt, success_b) -> jax.Array:
  """Action tokens of successful sessions: where VAPO's NLL term applies.

  success_b is per row [B], or per token [B, T] (rows holding several sessions).
  """
  ok = jnp.asarray(success_b) > 0
  return (mask_bt > 0) & (ok if ok.ndim == 2 else ok[:, None])
