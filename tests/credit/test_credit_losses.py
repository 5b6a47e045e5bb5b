"""Policy and value losses: PPO clip, aggregation, decoupled PPO, KL, entropy,
value loss, NLL, and the diagnostics they return."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_fixtures import seeds
from mtrl_jax.credit import (PolicyLossConfig, aggregate, decoupled_ppo_loss_bt,
                             entropy_from_logits, explained_variance, kl_estimate,
                             kl_reward_penalty, nll_loss, per_turn_mean_std, policy_loss,
                             ppo_clip_loss_bt, value_loss)

# Five tokens, old log-prob 0 (so log pi = log ratio):
#   A      1    1   -1   -1    2
#   ratio 1.5  .9   .5  1.1  1.0
# eps_low .2, eps_high .28:
#   t0: min(1.5, 1.28) * 1 -> loss -1.28 (clipped high)
#   t1: min(.9, .9)         -> loss -.9
#   t2: min(-.5, -.8)       -> loss  .8   (clipped low)
#   t3: min(-1.1, -1.1)     -> loss 1.1
#   t4: 2 * 1               -> loss -2
# token mean = (-1.28 - .9 + .8 + 1.1 - 2) / 5 = -2.28 / 5 = -.456
_ADV = np.array([[1, 1, -1, -1, 2]], np.float32)
_RATIO = np.array([[1.5, 0.9, 0.5, 1.1, 1.0]], np.float32)
_ONES = np.ones((1, 5), np.float32)


def test_ppo_clip_hand_example():
  loss_bt, flags = ppo_clip_loss_bt(jnp.log(_RATIO), jnp.zeros((1, 5)), _ADV, _ONES)
  np.testing.assert_allclose(loss_bt, [[-1.28, -0.9, 0.8, 1.1, -2.0]], rtol=1e-6)
  cfg = PolicyLossConfig()
  loss, diag = policy_loss(cfg, jnp.log(_RATIO), jnp.zeros((1, 5)), _ADV, _ONES)
  np.testing.assert_allclose(loss, -0.456, rtol=1e-6)
  np.testing.assert_allclose(diag["clip_frac_high"], 0.2)
  np.testing.assert_allclose(diag["clip_frac_low"], 0.2)
  np.testing.assert_allclose(diag["dual_clip_frac"], 0.0)
  # adv mean 2/5 = .4; var = mean((.6,.6,-1.4,-1.4,1.6)^2) = (.36+.36+1.96+1.96+2.56)/5 = 1.44
  np.testing.assert_allclose(diag["adv_mean"], 0.4, rtol=1e-6)
  np.testing.assert_allclose(diag["adv_std"], 1.2, rtol=1e-6)


def test_dual_clip_hand_example():
  # A = -1, ratio 5: plain PPO loss = max(5, 1.28) = 5; dual clip c = 3 caps it at 3.
  # A = +1, ratio 5: dual clip does not apply -> -1.28.
  logp = jnp.log(jnp.array([[5.0, 5.0]]))
  adv = jnp.array([[-1.0, 1.0]])
  plain, _ = ppo_clip_loss_bt(logp, jnp.zeros((1, 2)), adv, jnp.ones((1, 2)))
  dual, flags = ppo_clip_loss_bt(logp, jnp.zeros((1, 2)), adv, jnp.ones((1, 2)), dual_clip=3.0)
  np.testing.assert_allclose(plain, [[5.0, -1.28]], rtol=1e-6)
  np.testing.assert_allclose(dual, [[3.0, -1.28]], rtol=1e-6)
  assert np.asarray(flags["dual_clip"]).tolist() == [[True, False]]


def test_aggregation_hand_example():
  loss = jnp.array([[1.0, 2.0, 3.0, 50.0], [4.0, 60.0, 70.0, 80.0], [9.0, 9.0, 9.0, 9.0]])
  mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
  # token_mean: (1 + 2 + 3 + 4) / 4 = 2.5
  np.testing.assert_allclose(aggregate(loss, mask, "token_mean"), 2.5)
  # seq_mean_token_mean over the two non-empty rows: (6/3 + 4/1) / 2 = 3
  np.testing.assert_allclose(aggregate(loss, mask, "seq_mean_token_mean"), 3.0)
  # seq_mean_token_sum, constant 4 (= T): (6/4 + 4/4) / 2 = 1.25; constant 10: .5
  np.testing.assert_allclose(aggregate(loss, mask, "seq_mean_token_sum"), 1.25)
  np.testing.assert_allclose(aggregate(loss, mask, "seq_mean_token_sum", norm_len=10), 0.5)
  with pytest.raises(ValueError, match="token_mean"):
    aggregate(loss, mask, "mean")


def test_decoupled_ppo_hand_example():
  # Three tokens, A = 1, u = pi/pi_prox = 1.5 each; w = pi_prox/pi_behav = 2, 6, 1.
  # Token 1 has w = 6 > cap 5: dropped, not clipped.
  #   t0: -w * min(1.5, 1.28) = -2 * 1.28 = -2.56;  t2: -1 * 1.28 = -1.28
  # token mean over the two kept tokens: -3.84 / 2 = -1.92
  logp = jnp.log(jnp.array([[1.5, 1.5, 1.5]]))
  prox = jnp.zeros((1, 3))
  behav = -jnp.log(jnp.array([[2.0, 6.0, 1.0]]))
  adv = jnp.ones((1, 3))
  loss_bt, flags = decoupled_ppo_loss_bt(logp, prox, behav, adv, jnp.ones((1, 3)))
  np.testing.assert_allclose(loss_bt, [[-2.56, 0.0, -1.28]], rtol=1e-6)
  assert np.asarray(flags["keep"]).tolist() == [[True, False, True]]
  loss, diag = policy_loss(PolicyLossConfig(), logp, behav, adv, jnp.ones((1, 3)),
                           prox_logp_bt=prox)
  np.testing.assert_allclose(loss, -1.92, rtol=1e-6)
  np.testing.assert_allclose(diag["masked_frac_cap"], 1 / 3, rtol=1e-6)


def test_kl_hand_example():
  # pi = .5, pi_ref = .25: k1 = log 2 = .693147;
  # k3 = exp(log .25 - log .5) - (log .25 - log .5) - 1 = .5 + log 2 - 1 = .193147
  logp, ref = jnp.log(jnp.array([[0.5, 0.5]])), jnp.log(jnp.array([[0.25, 0.25]]))
  mask = jnp.array([[1.0, 0.0]])
  np.testing.assert_allclose(kl_estimate(logp, ref, mask, "k1"), [[math.log(2), 0]], rtol=1e-6)
  np.testing.assert_allclose(kl_estimate(logp, ref, mask, "k3"), [[0.5 + math.log(2) - 1, 0]],
                             rtol=1e-5)
  # As a reward penalty, coef .1, k1: r - .1 * log 2 on action tokens only.
  shaped = kl_reward_penalty(jnp.array([[1.0, 1.0]]), logp, ref, mask, coef=0.1, kind="k1")
  np.testing.assert_allclose(shaped, [[1 - 0.1 * math.log(2), 1.0]], rtol=1e-6)
  # As a loss term, kl_coef .5, with A = 0 (no policy-gradient term):
  cfg = PolicyLossConfig(kl_coef=0.5, kl_kind="k1")
  loss, diag = policy_loss(cfg, logp, logp, jnp.zeros((1, 2)), mask, ref_logp_bt=ref)
  np.testing.assert_allclose(loss, 0.5 * math.log(2), rtol=1e-6)
  np.testing.assert_allclose(diag["kl_ref"], math.log(2), rtol=1e-6)


def test_entropy_hand_example():
  # Uniform over 2 -> log 2; uniform over 4 (two huge equal logits + two -inf-ish) -> log 2.
  logits = jnp.array([[[0.0, 0.0, -1e9, -1e9], [1.0, 1.0, 1.0, 1.0]]])
  np.testing.assert_allclose(entropy_from_logits(logits), [[math.log(2), math.log(4)]],
                             rtol=1e-6)
  # Bonus coef .1, A = 0: loss = -.1 * mean(log 2, log 4) = -.1 * 1.5 log 2.
  cfg = PolicyLossConfig(ent_coef=0.1)
  loss, diag = policy_loss(cfg, jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.zeros((1, 2)),
                           jnp.ones((1, 2)), entropy_bt=entropy_from_logits(logits))
  np.testing.assert_allclose(loss, -0.15 * math.log(2), rtol=1e-6)
  np.testing.assert_allclose(diag["entropy"], 1.5 * math.log(2), rtol=1e-6)
  with pytest.raises(ValueError, match="entropy"):
    policy_loss(cfg, jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1, 2)))


def test_value_loss_hand_example():
  # eps .2. t0: V 1, Vold .5, Vt 2: unclipped (1-2)^2 = 1; clip(1, .3, .7) = .7,
  #   (.7-2)^2 = 1.69 -> .5 * 1.69 = .845.  t1: V = Vt = 2 -> 0.  t2 masked.
  # token mean = .845 / 2 = .4225
  v = jnp.array([[1.0, 2.0, 100.0]])
  old = jnp.array([[0.5, 2.0, -100.0]])
  tgt = jnp.array([[2.0, 2.0, 7.0]])
  mask = jnp.array([[1, 1, 0]])
  loss, diag = value_loss(v, old, tgt, mask, clip_eps=0.2)
  np.testing.assert_allclose(loss, 0.4225, rtol=1e-6)
  np.testing.assert_allclose(diag["value_clip_frac"], 0.5)
  # Unclipped: .5 * (1 + 0) / 2 = .25
  np.testing.assert_allclose(value_loss(v, old, tgt, mask, clip_eps=None)[0], 0.25, rtol=1e-6)


def test_explained_variance_hand_example():
  # target 1, 2, 3 (var 2/3); pred 1, 2, 2 -> residual 0, 0, 1 (var 2/9); EV = 1 - 1/3.
  ev = explained_variance(jnp.array([1.0, 2.0, 2.0, 50.0]), jnp.array([1.0, 2.0, 3.0, -50.0]),
                          jnp.array([1, 1, 1, 0]))
  np.testing.assert_allclose(ev, 2 / 3, rtol=1e-6)


def test_nll_on_successful_sessions_hand_example():
  # Row 0 succeeded: NLL = mean(1, 2) = 1.5; row 1 failed, not counted.
  logp = jnp.array([[-1.0, -2.0], [-3.0, -4.0]])
  np.testing.assert_allclose(nll_loss(logp, jnp.ones((2, 2)), jnp.array([1, 0])), 1.5)
  # Combined with mu = .5 and A = 0: loss = .5 * 1.5.
  cfg = PolicyLossConfig(nll_coef=0.5)
  loss, diag = policy_loss(cfg, logp, logp, jnp.zeros((2, 2)), jnp.ones((2, 2)),
                           success_b=jnp.array([1, 0]))
  np.testing.assert_allclose(loss, 0.75, rtol=1e-6)
  np.testing.assert_allclose(diag["nll"], 1.5)


def test_advantage_stats_by_turn_hand_example():
  # turn 0 holds advantages 1, 1, 2 -> mean 4/3, std sqrt(2/9);
  # turn 1 holds 3, 0, 0 -> mean 1, std sqrt((4 + 1 + 1) / 3) = sqrt 2; turn 2 empty.
  adv = jnp.array([[1.0, 1.0, 3.0], [2.0, 0.0, 0.0]])
  turn = jnp.array([[0, 0, 1], [0, 1, 1]])
  mean, std, cnt = per_turn_mean_std(adv, turn, jnp.ones((2, 3)), 3)
  np.testing.assert_allclose(mean, [4 / 3, 1.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(std, [math.sqrt(2 / 9), math.sqrt(2), 0.0], rtol=1e-6)
  np.testing.assert_allclose(cnt, [3, 3, 0])
  _, diag = policy_loss(PolicyLossConfig(max_turns=3), jnp.zeros((2, 3)), jnp.zeros((2, 3)),
                        adv, jnp.ones((2, 3)), turn_idx_bt=turn)
  np.testing.assert_allclose(diag["adv_mean_by_turn"], [4 / 3, 1.0, 0.0], rtol=1e-6)


def test_config_validation():
  with pytest.raises(ValueError, match="aggregation"):
    PolicyLossConfig(agg="sum")
  with pytest.raises(ValueError, match="dual_clip"):
    PolicyLossConfig(dual_clip=0.5)
  with pytest.raises(ValueError, match="KL kind"):
    PolicyLossConfig(kl_kind="k2")


def _random_inputs(seed, b=4, t=7):
  rng = np.random.default_rng(seed)
  mask = (rng.random((b, t)) < 0.6).astype(np.float32)
  old = np.log(rng.uniform(0.05, 1.0, (b, t))).astype(np.float32)
  logp = (old + rng.normal(0, 0.4, (b, t))).astype(np.float32)
  adv = rng.normal(size=(b, t)).astype(np.float32)
  ent = rng.uniform(0, 3, (b, t)).astype(np.float32)
  # Garbage on masked tokens: must neither leak into the loss nor its gradient.
  logp = np.where(mask > 0, logp, 80.0).astype(np.float32)
  old = np.where(mask > 0, old, -1e4).astype(np.float32)
  return jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), ent


@functools.lru_cache(maxsize=None)
def _loss_and_grad(cfg, decoupled: bool):
  def f(logp, behav, adv, mask, ent, ref):
    prox = behav if decoupled else None
    return policy_loss(cfg, logp, behav, adv, mask, prox_logp_bt=prox, entropy_bt=ent,
                       ref_logp_bt=ref)
  return jax.jit(jax.value_and_grad(f, has_aux=True))


_CFGS = [PolicyLossConfig(), PolicyLossConfig(dual_clip=3.0, agg="seq_mean_token_mean"),
         PolicyLossConfig(agg="seq_mean_token_sum", kl_coef=0.1, ent_coef=0.01,
                          entropy_top_rho=0.2)]


@settings(max_examples=30, deadline=None)
@given(seed=seeds, cfg=st.sampled_from(_CFGS))
def test_decoupled_equals_plain_ppo_when_behaviour_is_proximal(seed, cfg):
  logp, old, adv, mask, ent = _random_inputs(seed)
  ref = old
  (l1, d1), g1 = _loss_and_grad(cfg, False)(logp, old, adv, mask, ent, ref)
  (l2, d2), g2 = _loss_and_grad(cfg, True)(logp, old, adv, mask, ent, ref)
  assert float(l1) == float(l2)
  np.testing.assert_array_equal(g1, g2)
  assert float(d2["masked_frac_cap"]) == 0.0
  for k in ("clip_frac_low", "clip_frac_high", "approx_kl"):
    assert float(d1[k]) == float(d2[k]), k


@settings(max_examples=30, deadline=None)
@given(seed=seeds, cfg=st.sampled_from(_CFGS), decoupled=st.booleans())
def test_masked_tokens_get_no_loss_gradient(seed, cfg, decoupled):
  logp, old, adv, mask, ent = _random_inputs(seed)
  (loss, _), grad = _loss_and_grad(cfg, decoupled)(logp, old, adv, mask, ent, old)
  grad = np.asarray(grad)
  assert np.isfinite(float(loss)) and np.all(np.isfinite(grad))
  assert np.all(grad[np.asarray(mask) == 0] == 0.0)
  # ... and the value loss likewise.
  v_grad = jax.grad(lambda v: value_loss(v, v + 0.3, jnp.zeros_like(v), mask)[0])(logp)
  assert np.all(np.asarray(v_grad)[np.asarray(mask) == 0] == 0.0)


def test_policy_loss_jits_and_vmaps_over_seeds():
  cfg = PolicyLossConfig(kl_coef=0.1, ent_coef=0.01, entropy_top_rho=0.2, dual_clip=3.0)
  ins = [_random_inputs(s) for s in range(3)]
  stack = [jnp.stack([jnp.asarray(x[i]) for x in ins]) for i in range(5)]

  def f(logp, old, adv, mask, ent):
    return policy_loss(cfg, logp, old, adv, mask, prox_logp_bt=old, ref_logp_bt=old,
                       entropy_bt=ent, turn_idx_bt=jnp.zeros(logp.shape, jnp.int32))

  losses, diags = jax.jit(jax.vmap(f))(*stack)
  assert losses.shape == (3,) and diags["adv_mean_by_turn"].shape == (3, cfg.max_turns)
  for s in range(3):
    loss, _ = jax.jit(f)(*[jnp.asarray(x) for x in ins[s]])
    np.testing.assert_allclose(losses[s], loss, rtol=1e-5, atol=1e-6)
  v_loss, _ = jax.jit(jax.vmap(lambda v, m: value_loss(v, v, v * 0.5, m)))(stack[0], stack[3])
  assert v_loss.shape == (3,)
