"""Decoupled PPO with the proximal policy different from the behaviour one and
every ratio inside the clip range, worked by hand.

Here the clipped ratio u = pi / pi_prox and the weight w = pi_prox / pi_behav
are both visible: the loss is -A w u per token, and its gradient in log pi is
-A w u / N (nothing is clipped). Taking the ratio against the behaviour
policy instead (pi / pi_behav = u w) pushes tokens 0 and 2 past 1 + eps_high
and token 1 below 1 - eps_low, so both the loss and the gradient change.

Breaks checked (scratch copy, jit on and off): u = exp(logp - behav)
instead of exp(logp - prox) (loss -2.0 instead of -1.583, gradient 0);
w = exp(behav - prox) (inverted weight); w dropped (w = 1).
"""
import math

import jax
import jax.numpy as jnp
import numpy as np

from mtrl_jax.credit import PolicyLossConfig, decoupled_ppo_loss_bt, policy_loss

#            pi    pi_prox  pi_behav  A      u = pi/prox   w = prox/behav
# t0        .44     .40      .20     +1       1.1           2.0
# t1        .27     .30      .60     -1        .9            .5
# t2        .30     .30      .20     +2       1.0           1.5
PI = np.array([[0.44, 0.27, 0.30]])
PROX = np.array([[0.40, 0.30, 0.30]])
BEHAV = np.array([[0.20, 0.60, 0.20]])
ADV = np.array([[1.0, -1.0, 2.0]])
U = [1.1, 0.9, 1.0]
W = [2.0, 0.5, 1.5]
# per token loss w * max(-A u, -A clip(u, .8, 1.28)) = -A w u (u inside the range):
#   t0: -1 * 2 * 1.1 = -2.2;  t1: +1 * .5 * .9 = .45;  t2: -2 * 1.5 * 1 = -3
LOSS_BT = [-2.2, 0.45, -3.0]
LOSS = (-2.2 + 0.45 - 3.0) / 3  # token mean = -1.58333
GRAD = [-2.2 / 3, 0.45 / 3, -3.0 / 3]  # d loss / d log pi = -A w u / N


def _logs():
  return (jnp.asarray(np.log(PI), jnp.float32), jnp.asarray(np.log(PROX), jnp.float32),
          jnp.asarray(np.log(BEHAV), jnp.float32), jnp.asarray(ADV, jnp.float32))


def test_per_token_loss_uses_the_proximal_ratio_and_the_behaviour_weight():
  logp, prox, behav, adv = _logs()
  loss_bt, flags = decoupled_ppo_loss_bt(logp, prox, behav, adv, jnp.ones((1, 3)))
  np.testing.assert_allclose(loss_bt, [LOSS_BT], rtol=1e-5)
  np.testing.assert_allclose(flags["ratio"], [U], rtol=1e-5)
  np.testing.assert_allclose(flags["behav_weight"], [W], rtol=1e-5)
  for k in ("clip_low", "clip_high", "dual_clip"):
    assert not np.asarray(flags[k]).any(), k
  assert np.asarray(flags["keep"]).all()


def test_policy_loss_and_its_gradient_hand_example():
  logp, prox, behav, adv = _logs()
  cfg = PolicyLossConfig()  # eps .2 / .28, cap 5

  def f(lp):
    return policy_loss(cfg, lp, behav, adv, jnp.ones((1, 3)), prox_logp_bt=prox)

  (loss, diag), grad = jax.value_and_grad(f, has_aux=True)(logp)
  np.testing.assert_allclose(loss, LOSS, rtol=1e-5)
  np.testing.assert_allclose(grad, [GRAD], rtol=1e-5)
  assert float(diag["clip_frac_low"]) == 0.0 and float(diag["clip_frac_high"]) == 0.0
  assert float(diag["masked_frac_cap"]) == 0.0
  # approx KL of pi to pi_prox: mean(u - 1 - log u)
  want_kl = sum(u - 1 - math.log(u) for u in U) / 3
  np.testing.assert_allclose(diag["approx_kl"], want_kl, rtol=1e-3, atol=1e-7)


def test_the_behaviour_ratio_would_give_a_different_loss():
  """The same inputs read as plain PPO against pi_behav: ratios 2.2, .45, 1.5 all clip."""
  logp, _, behav, adv = _logs()
  plain, diag = policy_loss(PolicyLossConfig(), logp, behav, adv, jnp.ones((1, 3)))
  # t0: -1.28;  t1: max(.45, .8) = .8;  t2: -2 * 1.28 = -2.56 -> mean -3.04 / 3
  np.testing.assert_allclose(plain, (-1.28 + 0.8 - 2.56) / 3, rtol=1e-5)
  assert abs(float(plain) - LOSS) > 0.4
