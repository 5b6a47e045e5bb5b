"""Absolute-advantage-weighted episode sampling (MS-GRPO)."""
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings

from credit_fixtures import random_sessions, seeds, to_batch
from mtrl_jax.credit import aaw_probabilities, aaw_sample, make_credit_batch


def test_probabilities_hand_example():
  # |A| = 1, 3, 0 over valid slots, slot 3 invalid: p = .25, .75, 0, 0.
  p = aaw_probabilities(jnp.array([-1.0, 3.0, 0.0, 9.0]), jnp.array([1, 1, 1, 0]) > 0)
  np.testing.assert_allclose(p, [0.25, 0.75, 0, 0])
  # floor .5: weights 1.5, 3.5, .5 -> / 5.5
  p = aaw_probabilities(jnp.array([-1.0, 3.0, 0.0, 9.0]), jnp.array([1, 1, 1, 0]) > 0, 0.5)
  np.testing.assert_allclose(p, [1.5 / 5.5, 3.5 / 5.5, 0.5 / 5.5, 0], rtol=1e-6)
  # All advantages 0: uniform over the valid slots.
  p = aaw_probabilities(jnp.zeros(3), jnp.array([True, True, False]))
  np.testing.assert_allclose(p, [0.5, 0.5, 0])


def test_sample_hand_example():
  # Group 0 returns 1, 0 -> A = +-1; group 1 returns 2, 2 -> A = 0 (never drawn).
  # Episode 0 spans rows 0 and 1 (per-turn layout).
  batch = make_credit_batch(np.zeros((5, 2)), np.ones((5, 2)),
                            group_id_b=np.array([0, 0, 0, 1, 1]),
                            episode_id_b=np.array([0, 0, 1, 2, 3]),
                            return_b=np.array([1, 1, 0, 2, 2], np.float32))
  rows, slots, ok, probs = aaw_sample(jax.random.key(0), batch, 3)
  np.testing.assert_allclose(probs, [0.5, 0.5, 0, 0, 0], atol=1e-6)
  assert sorted(np.asarray(slots)[np.asarray(ok)].tolist()) == [0, 1]
  assert np.asarray(ok).sum() == 2
  assert np.asarray(rows).tolist() == [True, True, True, False, False]


_sample4 = jax.jit(lambda k, b: aaw_sample(k, b, 4))


@settings(max_examples=25, deadline=None)
@given(seed=seeds)
def test_draws_distinct_episodes_with_positive_probability(seed):
  batch = to_batch(random_sessions(seed, n_groups=2))
  rows, slots, ok, probs = _sample4(jax.random.key(seed), batch)
  slots, ok, probs = np.asarray(slots), np.asarray(ok), np.asarray(probs)
  assert len(set(slots.tolist())) == 4
  assert np.all(probs[slots[ok]] > 0) and np.all(probs[slots[~ok]] == 0)
  np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-5)


def test_empirical_frequencies_follow_probabilities():
  # Returns 0, 0, 1, 3: mean 1, deviations -1, -1, 0, 2, so |A| is proportional
  # to 1, 1, 0, 2 -> p = .25, .25, 0, .5. Single draws follow p.
  batch = make_credit_batch(np.zeros((4, 1)), np.ones((4, 1)), group_id_b=np.zeros(4),
                            return_b=np.array([0.0, 0.0, 1.0, 3.0]))
  keys = jax.random.split(jax.random.key(1), 4000)
  _, slots, _, probs = jax.jit(jax.vmap(lambda k: aaw_sample(k, batch, 1)))(keys)
  np.testing.assert_allclose(probs[0], [0.25, 0.25, 0, 0.5], rtol=1e-5)
  freq = np.bincount(np.asarray(slots)[:, 0], minlength=4) / 4000
  np.testing.assert_allclose(freq, [0.25, 0.25, 0, 0.5], atol=0.03)
