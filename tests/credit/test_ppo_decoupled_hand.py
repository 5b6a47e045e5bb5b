"""Decoupled PPO by hand, with every ratio inside the clip range and the
proximal policy far from the behaviour policy.

The clipped ratio is u = pi / pi_prox and the token weight w = pi_prox /
pi_behav (AReaL, arXiv 2505.24298). Here the ratios stay inside [1 - eps_low,
1 + eps_high], so the loss of each token is simply -w * u * A and its gradient
with respect to log pi is -w * u * A / N: a formula that uses pi_behav where
pi_prox belongs changes both by a wide margin. The expected numbers are
written out in numpy from the formula above, not computed with the code
under test.

Break checked (issue 20, survived two reviews): `_log_ratio(logp_bt,
behav_logp_bt, m)` for the ratio in `decoupled_ppo_loss_bt` (the behaviour
log-probs where the proximal ones belong): loss -0.10 instead of -0.78, three
of five gradient entries 0 (clipped) and the other two twice too large; the
first two tests fail. The earlier hand
example clipped every ratio at 1 + eps_high under both formulas and so could
not tell them apart.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mtrl_jax.credit.losses import PolicyLossConfig, policy_loss
from mtrl_jax.credit.ppo import decoupled_ppo_loss_bt

# Two rows of three tokens; the last token of row 1 is padding.
LOGP = np.array([[-1.00, -0.50, -2.00], [-0.70, -1.20, -9.00]], np.float32)
PROX = np.array([[-1.08, -0.45, -2.15], [-0.75, -1.10, 3.00]], np.float32)   # u = e^(logp - prox)
BEHAV = np.array([[-1.68, -1.20, -2.75], [-1.50, -1.70, 0.00]], np.float32)  # w = e^(prox - behav)
ADV = np.array([[1.5, -0.8, 2.0], [-1.2, 0.6, 5.0]], np.float32)
MASK = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
EPS_LOW, EPS_HIGH = 0.2, 0.28


def expected():
  """(loss, d loss / d logp) by hand: token mean of -w u A over the 5 action tokens."""
  m = MASK > 0
  u = np.exp(LOGP - PROX)
  w = np.exp(PROX - BEHAV)
  assert np.all((u[m] > 1 - EPS_LOW) & (u[m] < 1 + EPS_HIGH))  # no clipping anywhere
  assert np.all(w[m] > 1.8)  # the proximal policy is far from the behaviour policy
  n = m.sum()
  per_token = np.where(m, -w * u * ADV, 0.0)
  return per_token.sum() / n, np.where(m, -w * u * ADV / n, 0.0)


def test_ratios_inside_the_clip_range_give_minus_w_u_a():
  want_loss, want_grad = expected()

  def loss_fn(logp):
    loss_bt, flags = decoupled_ppo_loss_bt(logp, jnp.asarray(PROX), jnp.asarray(BEHAV), jnp.asarray(ADV),
                                           jnp.asarray(MASK), eps_low=EPS_LOW, eps_high=EPS_HIGH,
                                           behav_cap=5.0)
    return jnp.sum(loss_bt) / jnp.sum(MASK), flags

  (loss, flags), grad = jax.value_and_grad(loss_fn, has_aux=True)(jnp.asarray(LOGP))
  np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-5, atol=1e-7)
  assert not np.asarray(flags["clip_high"]).any() and not np.asarray(flags["clip_low"]).any()
  np.testing.assert_allclose(np.asarray(flags["behav_weight"])[MASK > 0], np.exp(PROX - BEHAV)[MASK > 0],
                             rtol=1e-6)


def test_policy_loss_with_proximal_logprobs_is_the_decoupled_loss():
  """The same numbers through `policy_loss` (what the learner calls), token mean."""
  want_loss, want_grad = expected()
  cfg = PolicyLossConfig(eps_low=EPS_LOW, eps_high=EPS_HIGH, behav_cap=5.0, agg="token_mean")

  def loss_fn(logp):
    loss, _ = policy_loss(cfg, logp, jnp.asarray(BEHAV), jnp.asarray(ADV), jnp.asarray(MASK),
                          prox_logp_bt=jnp.asarray(PROX))
    return loss

  loss, grad = jax.value_and_grad(loss_fn)(jnp.asarray(LOGP))
  np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-5, atol=1e-7)
  # The naive loss (behaviour log-probs as pi_old, no weight) is far from it here.
  naive, _ = policy_loss(cfg, jnp.asarray(LOGP), jnp.asarray(BEHAV), jnp.asarray(ADV), jnp.asarray(MASK))
  assert abs(float(naive) - want_loss) > 0.1 * abs(want_loss)


@pytest.mark.parametrize("cap", [1.9, 2.0])
def test_the_behaviour_cap_drops_tokens_by_w_not_by_u(cap):
  """Tokens with w = pi_prox / pi_behav above the cap leave the loss (numerator and
  denominator of the token mean); u plays no part in that choice."""
  cfg = PolicyLossConfig(eps_low=EPS_LOW, eps_high=EPS_HIGH, behav_cap=cap, agg="token_mean")
  m = MASK > 0
  u, w = np.exp(LOGP - PROX), np.exp(PROX - BEHAV)
  keep = m & (w <= cap)
  assert 0 < keep.sum() < m.sum()
  want = np.where(keep, -w * u * ADV, 0.0).sum() / keep.sum()
  loss, _ = policy_loss(cfg, jnp.asarray(LOGP), jnp.asarray(BEHAV), jnp.asarray(ADV), jnp.asarray(MASK),
                        prox_logp_bt=jnp.asarray(PROX))
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
