"""Option checks and defaults of the losses: each bound tried just inside and
just outside, each message read in full, each default pinned by a value it
changes.

Found by mutation testing (docs/mutation.md): bounds moved by one
(`eps_low < 1` -> `<= 1`, `dual_clip <= 1` -> `< 1`, `behav_cap < 1` ->
`<= 1`, `norm_len <= 0` -> `< 0`, ...), messages emptied or wrapped, and
defaults changed (eps_low .2 -> 1.2, behav_cap 5 -> 6, kl kind k3 -> K3,
top-rho .2 -> 1.2) survived the earlier tests. Breaks checked by hand in a
scratch copy: `behav_cap < 1.0` -> `<= 1.0` in PolicyLossConfig, the
reward-penalty default kind "k1" -> "k3", and high_entropy_mask's default
rho .2 -> .5.
"""
import math
import re

import jax.numpy as jnp
import numpy as np
import pytest

from mtrl_jax.credit import (PolicyLossConfig, aggregate, decoupled_ppo_loss_bt, high_entropy_mask,
                             kl_estimate, kl_reward_penalty, nll_loss, policy_loss, ppo_clip_loss_bt,
                             value_loss)
from mtrl_jax.credit.token_mask import ceil_fraction_of

ONE = jnp.ones((1, 1))


def _raises(fn, message):
  """fn() raises ValueError with exactly this message."""
  with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
    fn()


@pytest.mark.parametrize("loss_fn", ["plain", "decoupled", "config"])
def test_clip_range_bounds(loss_fn):
  def call(**kw):
    if loss_fn == "plain":
      return ppo_clip_loss_bt(ONE, ONE, ONE, ONE, **kw)
    if loss_fn == "decoupled":
      return decoupled_ppo_loss_bt(ONE, ONE, ONE, ONE, ONE, **kw)
    return PolicyLossConfig(**kw)

  for ok in (dict(eps_low=0.0), dict(eps_low=0.99), dict(eps_high=0.0), dict(dual_clip=1.01),
             dict(dual_clip=None)):
    call(**ok)
  for lo, hi in ((1.0, 0.28), (-0.01, 0.28), (0.2, -0.01)):
    _raises(lambda: call(eps_low=lo, eps_high=hi),
            f"need 0 <= eps_low < 1 and eps_high >= 0, got {lo}, {hi}")
  for c in (1.0, 0.5):
    _raises(lambda: call(dual_clip=c), f"dual_clip must be > 1, got {c!r}")


def test_behaviour_cap_bounds():
  decoupled_ppo_loss_bt(ONE, ONE, ONE, ONE, ONE, behav_cap=1.0)
  decoupled_ppo_loss_bt(ONE, ONE, ONE, ONE, ONE, behav_cap=None)
  PolicyLossConfig(behav_cap=1.0)
  PolicyLossConfig(behav_cap=None)
  _raises(lambda: decoupled_ppo_loss_bt(ONE, ONE, ONE, ONE, ONE, behav_cap=0.99),
          "behav_cap must be >= 1, got 0.99")
  _raises(lambda: PolicyLossConfig(behav_cap=0.99), "behav_cap must be >= 1, got 0.99")


def test_policy_config_bounds_and_messages():
  for ok in (dict(entropy_top_rho=1.0), dict(entropy_top_rho=0.01), dict(norm_len=1),
             dict(max_turns=1), dict(agg="seq_mean_token_sum"), dict(kl_kind="k1")):
    PolicyLossConfig(**ok)
  for rho in (0.0, 1.01, -0.5):
    _raises(lambda: PolicyLossConfig(entropy_top_rho=rho),
            f"entropy_top_rho must lie in (0, 1], got {rho!r}")
  for n in (0, -3):
    _raises(lambda: PolicyLossConfig(norm_len=n), f"norm_len must be positive, got {n!r}")
  _raises(lambda: PolicyLossConfig(max_turns=0), "max_turns must be >= 1, got 0")
  _raises(lambda: PolicyLossConfig(agg="sum"),
          "unknown aggregation 'sum'; valid: ('token_mean', 'seq_mean_token_mean', "
          "'seq_mean_token_sum')")
  _raises(lambda: PolicyLossConfig(kl_kind="k2"), "unknown KL kind 'k2'; valid: ('k1', 'k3')")


def test_missing_inputs_are_named():
  z = jnp.zeros((1, 2))
  _raises(lambda: policy_loss(PolicyLossConfig(ent_coef=0.1), z, z, z, z + 1),
          "ent_coef / entropy_top_rho need entropy_bt")
  _raises(lambda: policy_loss(PolicyLossConfig(entropy_top_rho=0.5), z, z, z, z + 1),
          "ent_coef / entropy_top_rho need entropy_bt")
  _raises(lambda: policy_loss(PolicyLossConfig(kl_coef=0.1), z, z, z, z + 1),
          "kl_coef != 0 needs ref_logp_bt")
  _raises(lambda: policy_loss(PolicyLossConfig(nll_coef=0.1), z, z, z, z + 1),
          "nll_coef != 0 needs success_b")
  _raises(lambda: aggregate(z, z, "mean"),
          "unknown aggregation 'mean'; valid: ('token_mean', 'seq_mean_token_mean', "
          "'seq_mean_token_sum')")
  _raises(lambda: kl_estimate(z, z, z, "k2"), "unknown KL kind 'k2'; valid: ('k1', 'k3')")
  _raises(lambda: ceil_fraction_of(1.5, 4), "rho must lie in [0, 1], got 1.5")
  _raises(lambda: ceil_fraction_of(-0.1, 4), "rho must lie in [0, 1], got -0.1")


def test_no_entropy_needed_when_both_entropy_options_are_off():
  """ent_coef 0 and no top-rho: entropy_bt may be absent (and no entropy diagnostic appears)."""
  z = jnp.zeros((1, 2))
  _, diag = policy_loss(PolicyLossConfig(), z, z, z, z + 1)
  assert "entropy" not in diag and "kl_ref" not in diag and "nll" not in diag


def test_clip_defaults():
  """Defaults eps_low .2 / eps_high .28 / cap 5, read off one token each.

  A = -1, ratio .5 -> max(.5, .8) = .8 (eps_low .2); A = +1, ratio 1.5 -> -1.28
  (eps_high .28); a weight of 4.9 is kept and one of 5.1 dropped (cap 5).
  """
  logp = jnp.log(jnp.array([[0.5, 1.5]]))
  adv = jnp.array([[-1.0, 1.0]])
  plain, _ = ppo_clip_loss_bt(logp, jnp.zeros((1, 2)), adv, jnp.ones((1, 2)))
  np.testing.assert_allclose(plain, [[0.8, -1.28]], rtol=1e-6)
  dec, _ = decoupled_ppo_loss_bt(logp, jnp.zeros((1, 2)), jnp.zeros((1, 2)), adv, jnp.ones((1, 2)))
  np.testing.assert_allclose(dec, [[0.8, -1.28]], rtol=1e-6)
  w = jnp.array([[4.9, 5.1]])
  _, flags = decoupled_ppo_loss_bt(jnp.zeros((1, 2)), jnp.zeros((1, 2)), -jnp.log(w),
                                   jnp.ones((1, 2)), jnp.ones((1, 2)))
  assert np.asarray(flags["keep"]).tolist() == [[True, False]]
  cfg = PolicyLossConfig()
  loss, _ = policy_loss(cfg, logp, jnp.zeros((1, 2)), adv, jnp.ones((1, 2)))
  np.testing.assert_allclose(loss, (0.8 - 1.28) / 2, rtol=1e-6)


def test_regularizer_defaults():
  """kl_estimate defaults to k3, kl_reward_penalty to k1, high_entropy_mask to rho .2."""
  logp, ref = jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]]))
  np.testing.assert_allclose(kl_estimate(logp, ref, ONE), [[0.5 + math.log(2) - 1]], rtol=1e-5)
  np.testing.assert_allclose(kl_reward_penalty(ONE, logp, ref, ONE, coef=1.0),
                             [[1 - math.log(2)]], rtol=1e-6)
  ent = jnp.arange(10.0).reshape(2, 5)  # 10 valid tokens: ceil(.2 * 10) = 2 kept, entropies 9 and 8
  keep = np.asarray(high_entropy_mask(ent, jnp.ones((2, 5))))
  assert keep.tolist() == [[False] * 5, [False, False, False, True, True]]


def test_loss_aggregation_defaults_are_token_mean():
  """value_loss, nll_loss and aggregate default to token_mean (rows of 1 and 3 tokens)."""
  x = jnp.array([[2.0, 0.0, 0.0], [4.0, 4.0, 10.0]])
  mask = jnp.array([[1, 0, 0], [1, 1, 1]])
  # token mean (2 + 4 + 4 + 10) / 4 = 5; a per-row mean would give (2 + 6) / 2 = 4.
  np.testing.assert_allclose(aggregate(x, mask), 5.0)
  np.testing.assert_allclose(nll_loss(-x, mask, jnp.array([1, 1])), 5.0)
  v_loss, _ = value_loss(jnp.sqrt(2 * x), jnp.sqrt(2 * x), jnp.zeros_like(x), mask)
  np.testing.assert_allclose(v_loss, 5.0, rtol=1e-6)


def test_nll_loss_passes_its_options_through():
  """nll_loss's agg, norm_len and segment_ids reach the aggregation (hand example)."""
  logp = jnp.array([[-1.0, -3.0, -2.0, -9.0]])
  mask = jnp.array([[1, 1, 1, 0]])
  seg = jnp.array([[1, 1, 2, 0]])
  ok = jnp.array([1])
  # sequences (1, 3) and (2): per-sequence means 2 and 2 -> 2; per-row mean (1 + 3 + 2) / 3 = 2
  # seq_mean_token_sum, norm_len 2: (4 / 2 + 2 / 2) / 2 = 1.5; as one row: 6 / 2 = 3
  np.testing.assert_allclose(nll_loss(logp, mask, ok, "seq_mean_token_sum", 2, seg), 1.5)
  np.testing.assert_allclose(nll_loss(logp, mask, ok, "seq_mean_token_sum", 2), 3.0)
  np.testing.assert_allclose(nll_loss(logp, mask, ok, "seq_mean_token_sum"), 6 / 4)
