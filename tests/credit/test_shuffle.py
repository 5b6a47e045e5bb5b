"""credit/shuffle.py: the positive control's shuffled advantages."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mtrl_jax.credit.shuffle import shuffle_advantages


_shuffle = jax.jit(shuffle_advantages)  # one compile for every example (shapes are fixed below)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_shuffle_keeps_the_multiset_on_the_mask_and_zeros_elsewhere(seed):
  """Catches values leaking onto unmasked tokens (padding, observations), values lost or duplicated
  by the scatter, and a mask read as 'nonzero advantage'."""
  rng = np.random.default_rng(seed)
  b, t = 4, 7
  mask = rng.random((b, t)) < 0.6
  adv = np.where(mask, rng.standard_normal((b, t)), 0.0).astype(np.float32)
  adv[mask & (rng.random((b, t)) < 0.2)] = 0.0  # masked zeros are advantages too
  out = np.asarray(_shuffle(jnp.asarray(adv), jnp.asarray(mask, jnp.float32), jax.random.key(seed)))
  assert np.all(out[~mask] == 0.0)
  np.testing.assert_array_equal(np.sort(out[mask]), np.sort(adv[mask]))


def test_shuffle_breaks_the_pairing_and_draws_every_permutation():
  """4 masked tokens with values 0..3 over 2400 keys: each of the 24 orders turns up 100 +- 40 times, and
  value 0 lands on each masked slot about a quarter of the time. Catches the identity (no shuffle), a
  shuffle within each row only (row 0's values never reach row 1), and a fixed key."""
  adv = jnp.array([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
  mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
  keys = jax.random.split(jax.random.key(0), 2400)
  out = np.asarray(jax.vmap(lambda k: shuffle_advantages(adv, mask, k))(keys))
  slots = out[:, [0, 0, 1, 1], [0, 1, 0, 2]]
  orders, counts = np.unique(slots, axis=0, return_counts=True)
  assert len(orders) == 24 and counts.min() > 60 and counts.max() < 140
  assert np.all(np.abs((slots == 0.0).mean(0) - 0.25) < 0.04)
  assert np.all(out[:, 0, 2] == 0) and np.all(out[:, 1, 1] == 0)


def test_shuffle_rejects_mismatched_shapes():
  with pytest.raises(ValueError, match="differ in shape"):
    shuffle_advantages(jnp.zeros((2, 3)), jnp.zeros((3, 2)), jax.random.key(0))
