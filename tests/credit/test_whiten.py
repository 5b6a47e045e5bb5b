"""credit/whiten.py: advantages whitened over the masked tokens, against a float64 numpy oracle.

Random shapes, padding rows, partial masks, constant batches and affine transforms (hypothesis). Each
docstring names the break it was checked against, in a scratch copy of credit/whiten.py.
"""
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from mtrl_jax.credit.whiten import EPS, masked_whiten

SHAPES = ((1, 1), (2, 3), (5, 10), (9, 16))  # a small set: one compile each
_whiten = jax.jit(masked_whiten)


def oracle(adv, mask):
  m = mask > 0
  if not m.any():
    return np.zeros_like(adv, np.float64)
  x = adv.astype(np.float64)
  mean = x[m].mean()
  var = ((x[m] - mean) ** 2).mean()
  return np.where(m, (x - mean) / np.sqrt(var + EPS), 0.0)


@st.composite
def batches(draw):
  b, t = draw(st.sampled_from(SHAPES))
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  mask = (rng.random((b, t)) < draw(st.sampled_from([0.3, 0.7, 1.0]))).astype(np.float32)
  mask[rng.random(b) < 0.2] = 0.0  # padding rows
  scale, shift = draw(st.sampled_from([1e-2, 1.0, 30.0])), draw(st.floats(-5.0, 5.0, width=32))
  adv = (rng.standard_normal((b, t)) * scale + shift).astype(np.float32)
  adv[mask == 0] = rng.standard_normal(int((mask == 0).sum())).astype(np.float32) * 100  # junk off the mask
  return adv, mask


@settings(max_examples=80, deadline=None)
@given(batches())
def test_matches_the_float64_oracle_and_is_exactly_zero_off_the_mask(batch):
  """The masked tokens' mean and variance only, each token once; the junk the padding carries is ignored.

  Breaks checked: mean over every token (`adv.mean()`) fails the oracle (the junk off the mask is
  +-100); variance divided by n - 1 fails it on the small batches; the output not masked (`(adv - mean)
  * rsqrt(...)` returned as is) fails 'exactly zero off the mask'."""
  adv, mask = batch
  got = np.asarray(_whiten(jnp.asarray(adv), jnp.asarray(mask)))
  assert np.all(got[mask == 0] == 0.0)
  np.testing.assert_allclose(got, oracle(adv, mask), rtol=2e-4, atol=2e-4)


@settings(max_examples=60, deadline=None)
@given(batches(), st.floats(0.125, 8.0, width=32), st.floats(-3.0, 3.0, width=32))
def test_an_affine_change_of_the_advantages_changes_nothing(batch, a, b):
  """A critic whose values are off by a constant (every TD error shifted) or a reward scale: the
  whitened advantages are the same; the masked ones have mean 0 and spread 1 when they vary.

  Break checked: only the mean subtracted (no division by the spread) fails the scale half."""
  adv, mask = batch
  m = mask > 0
  if m.sum() < 2 or adv[m].std() * min(a, 1.0) < 0.05:  # eps (1e-8) a visible share of the variance below
    return
  x = np.asarray(_whiten(jnp.asarray(adv), jnp.asarray(mask)))
  y = np.asarray(_whiten(jnp.asarray(adv * np.float32(a) + np.float32(b)), jnp.asarray(mask)))
  np.testing.assert_allclose(y, x, rtol=1e-3, atol=1e-3)
  assert abs(x[m].mean()) < 1e-4 and abs(x[m].std() - 1.0) < 1e-3


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(SHAPES), st.floats(-4.0, 4.0, width=32))
def test_a_constant_batch_and_an_empty_mask_give_zeros_not_nan(shape, value):
  """Every masked advantage equal (no direction to push) and a batch with no action token: exactly zeros.

  Breaks checked: eps dropped (`rsqrt(var)`) gives NaN on the constant batch; the mean taken without
  the shift by a masked value (`adv.sum() / n`) leaves up to 0.02 on it (float32's sum of equal values
  is not exact: 5 x 10 of 3.96 gave 0.019)."""
  adv = np.full(shape, value, np.float32)
  got = np.asarray(_whiten(jnp.asarray(adv), jnp.ones(shape, jnp.float32)))
  assert np.all(got == 0.0)
  assert np.all(np.asarray(_whiten(jnp.asarray(adv), jnp.zeros(shape, jnp.float32))) == 0.0)
