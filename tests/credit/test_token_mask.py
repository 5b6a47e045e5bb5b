"""High-entropy (forking) token mask: batch-wide top ceil(rho * N)."""
import functools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_fixtures import seeds
from mtrl_jax.credit import PolicyLossConfig, high_entropy_mask, policy_loss


def test_hand_example_with_ties():
  # Valid entropies (last token masked): .5 .9 .1 / .9 .3  -> N = 5.
  # rho .2: ceil(1.0) = 1 token; the two .9 tie and the earlier one (row 0) wins.
  # rho .5: ceil(2.5) = 3 tokens: both .9 and the .5.
  ent = jnp.array([[0.5, 0.9, 0.1], [0.9, 0.3, 5.0]])
  mask = jnp.array([[1, 1, 1], [1, 1, 0]])
  assert np.asarray(high_entropy_mask(ent, mask, 0.2)).tolist() == [[False, True, False],
                                                                    [False, False, False]]
  assert np.asarray(high_entropy_mask(ent, mask, 0.5)).tolist() == [[True, True, False],
                                                                    [True, False, False]]


def test_pg_term_uses_only_kept_tokens():
  # Ratio 1, A = 1, 2, 3, 4 with entropies 0, 1, 2, 3 and rho .5 -> keep the
  # two highest-entropy tokens (A = 3, 4): token mean of -A = -3.5.
  adv = jnp.array([[1.0, 2.0, 3.0, 4.0]])
  ent = jnp.array([[0.0, 1.0, 2.0, 3.0]])
  cfg = PolicyLossConfig(entropy_top_rho=0.5)
  loss, diag = policy_loss(cfg, jnp.zeros((1, 4)), jnp.zeros((1, 4)), adv, jnp.ones((1, 4)),
                           entropy_bt=ent)
  np.testing.assert_allclose(loss, -3.5)
  np.testing.assert_allclose(diag["masked_frac_entropy"], 0.5)


@functools.lru_cache(maxsize=None)
def _mask_fn(rho):
  return jax.jit(lambda e, m: high_entropy_mask(e, m, rho))


@settings(max_examples=40, deadline=None)
@given(seed=seeds, rho=st.sampled_from([0.2, 0.1, 0.25, 0.5, 0.3, 1.0, 0.05]),
       coarse=st.booleans())
def test_keeps_ceil_rho_n_tokens_batch_wide(seed, rho, coarse):
  rng = np.random.default_rng(seed)
  mask = rng.random((5, 9)) < rng.uniform(0.0, 1.0)
  ent = rng.uniform(0, 2, (5, 9)).astype(np.float32)
  if coarse:  # many ties
    ent = np.round(ent * 2) / 2
  keep = np.asarray(_mask_fn(rho)(ent, mask))
  n = int(mask.sum())
  k = math.ceil(Fraction(str(rho)) * n)
  assert keep.sum() == k
  assert not np.any(keep & ~mask)
  if 0 < k < n:  # every kept token is at least as uncertain as every dropped one
    assert ent[keep].min() >= ent[mask & ~keep].max()
