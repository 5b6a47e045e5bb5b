"""Masked statistics, KL / entropy / NLL terms and the forking-token mask
against the float64 numpy reference (loss_oracle.py), plus hand examples for
the cases a random draw rarely hits.

Found by mutation testing (docs/mutation.md): a one-token turn's mean divided
by max(count, 2), the explained variance's zero-variance branch, logits
reduced over the wrong axis or left in bfloat16, and the k3 estimate's
`- 1` survived the earlier tests. Breaks checked by hand in a scratch copy:
`jnp.maximum(cnt, 1.0)` -> `2.0` in per_turn_mean_std, entropy_from_logits
without its float32 cast, `exp(d) - d - 1` -> `exp(d) - d + 1`.
"""
import math
from fractions import Fraction

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import loss_oracle as ref
from mtrl_jax.credit import (entropy_from_logits, explained_variance, high_entropy_mask, kl_estimate,
                             kl_reward_penalty, per_turn_mean_std)
from mtrl_jax.credit import diagnostics as dg
from mtrl_jax.credit.regularizers import nll_mask
from mtrl_jax.credit.token_mask import ceil_fraction_of

cases = st.builds(lambda seed, bt: (seed, *bt), st.integers(0, 2**31 - 1),
                  st.sampled_from([(1, 1), (2, 3), (3, 6)]))


def _draw(seed, b, t):
  r = np.random.default_rng(seed)
  mask = (r.random((b, t)) < 0.7).astype(np.float32)
  mask[0, 0] = 1.0
  x = r.normal(0, 2, (b, t)).astype(np.float32)
  y = (x + r.normal(0, 1, (b, t))).astype(np.float32)
  turn = r.integers(-1, 5, (b, t)).astype(np.int32)
  return mask, np.where(mask > 0, x, 1e6).astype(np.float32), y, turn


@settings(max_examples=15, deadline=None)
@given(case=cases, k=st.sampled_from([1, 3, 4]))
def test_masked_statistics_match_the_reference(case, k):
  mask, x, y, turn = _draw(*case)
  xd, yd = x.astype(np.float64), y.astype(np.float64)
  np.testing.assert_allclose(dg.masked_mean(x, mask), ref.masked_mean(xd, mask), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(dg.masked_var(x, mask), ref.masked_var(xd, mask), rtol=1e-4, atol=1e-5)
  flag = x > 0
  np.testing.assert_allclose(dg.masked_fraction(flag, mask), ref.masked_mean(flag.astype(float), mask),
                             rtol=1e-6)
  np.testing.assert_allclose(explained_variance(y, x, mask), ref.explained_variance(yd, xd, mask),
                             rtol=1e-4, atol=1e-5)
  got = per_turn_mean_std(x, turn, mask, k)
  want = ref.per_turn_mean_std(xd, turn, mask, k)
  for g, w, name in zip(got, want, ("mean", "std", "count")):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=name)


def test_one_token_turns_and_out_of_range_turns_hand_example():
  """Turn 0 holds one token (3), turn 1 two (1, 5); turns -1 and 2 (= max_turns) are left out.

  mean 3 and 3, std 0 and 2, count 1 and 2.
  """
  x = jnp.array([[3.0, 1.0, 5.0, 100.0, -100.0]])
  turn = jnp.array([[0, 1, 1, -1, 2]])
  mean, std, cnt = per_turn_mean_std(x, turn, jnp.ones((1, 5)), 2)
  np.testing.assert_allclose(mean, [3.0, 3.0])
  np.testing.assert_allclose(std, [0.0, 2.0])
  np.testing.assert_allclose(cnt, [1.0, 2.0])


def test_one_token_statistics_hand_example():
  """A single valid token: mean = the token, variance 0, explained variance 0 (flat targets)."""
  x, mask = jnp.array([[4.0, 9.0]]), jnp.array([[1.0, 0.0]])
  assert float(dg.masked_mean(x, mask)) == 4.0
  assert float(dg.masked_var(x, mask)) == 0.0
  assert float(explained_variance(jnp.array([[1.0, 2.0]]), x, mask)) == 0.0
  # No valid token at all: 0, not nan.
  assert float(dg.masked_mean(x, jnp.zeros((1, 2)))) == 0.0
  # Two targets 1, 3 (var 1) predicted as 2, 2 (residual var 1): EV 0; predicted exactly: 1.
  t, m = jnp.array([1.0, 3.0]), jnp.ones(2)
  np.testing.assert_allclose(explained_variance(jnp.array([2.0, 2.0]), t, m), 0.0, atol=1e-7)
  np.testing.assert_allclose(explained_variance(t, t, m), 1.0)
  np.testing.assert_allclose(explained_variance(jnp.array([3.0, 1.0]), t, m), -3.0)


@settings(max_examples=15, deadline=None)
@given(case=cases, kind=st.sampled_from(["k1", "k3"]), coef=st.sampled_from([0.1, 2.0]))
def test_kl_terms_match_the_reference(case, kind, coef):
  mask, _, _, _ = _draw(*case)
  r = np.random.default_rng(case[0])
  logp = np.log(r.uniform(0.05, 1, mask.shape)).astype(np.float32)
  ref_logp = (logp + r.normal(0, 0.5, mask.shape)).astype(np.float32)
  logp, ref_logp = np.where(mask > 0, logp, 80.0), np.where(mask > 0, ref_logp, -1e4)
  want = ref.kl(logp.astype(np.float64), ref_logp.astype(np.float64), mask, kind)
  np.testing.assert_allclose(kl_estimate(logp, ref_logp, mask, kind), want, rtol=1e-4, atol=1e-6)
  reward = r.normal(size=mask.shape).astype(np.float32)
  np.testing.assert_allclose(kl_reward_penalty(reward, logp, ref_logp, mask, coef=coef, kind=kind),
                             reward - coef * want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_entropy_matches_the_reference(dtype):
  """Random logits [2, 3, 7] (bfloat16 too: the entropy is computed in float32 of the rounded logits)."""
  logits = jnp.asarray(np.random.default_rng(0).normal(0, 3, (2, 3, 7)), dtype)
  want = ref.entropy(np.asarray(logits.astype(jnp.float32), np.float64))
  got = entropy_from_logits(logits)
  assert got.dtype == jnp.float32 and got.shape == (2, 3)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_nll_mask_per_row_and_per_token_success():
  mask = jnp.array([[1, 1, 0], [1, 0, 1], [1, 1, 1]])
  # success 1, 0 and 0.5 (> 0 counts as success)
  got = nll_mask(mask, jnp.array([1.0, 0.0, 0.5]))
  assert np.asarray(got).tolist() == [[True, True, False], [False, False, False], [True, True, True]]
  per_tok = jnp.array([[1, 0, 1], [1, 1, 1], [0, 0, 2]])
  got = nll_mask(mask, per_tok)
  assert np.asarray(got).tolist() == [[True, False, False], [True, False, True], [False, False, True]]


@settings(max_examples=15, deadline=None)
@given(case=cases, rho=st.sampled_from([0.05, 0.2, 0.3, 0.5, 1.0]))
def test_forking_token_mask_matches_the_reference(case, rho):
  mask, x, _, _ = _draw(*case)
  ent = np.round(np.abs(x) * 2) / 2  # ties
  np.testing.assert_array_equal(high_entropy_mask(ent, mask, rho), ref.top_entropy(ent, mask, rho))


@pytest.mark.parametrize("rho", [0.0, 0.2, 0.3, 1 / 3, 0.7071, 1.0])
def test_ceil_fraction_is_exact_for_large_counts(rho):
  p = Fraction(rho).limit_denominator(10_000)
  for n in (0, 1, 7, 9_999, 10_001, 2_000_003):
    assert int(ceil_fraction_of(rho, n)) == math.ceil(p * n), (rho, n)
