"""Advantages shuffled within the batch: the study's positive control (a learner that must not learn).

The shuffled estimator keeps the batch's advantages as a multiset (same mean,
spread and scale, so the same step sizes) and breaks their pairing with the
tokens they were computed for. An experiment whose real estimator does not
beat its shuffled twin cannot detect a credit difference at all: it is
underpowered, whatever its other comparisons say.
"""
import jax
import jax.numpy as jnp


def shuffle_advantages(adv_bt: jax.Array, mask_bt: jax.Array, key: jax.Array) -> jax.Array:
  """A uniform random permutation of adv over the tokens where mask > 0; elsewhere adv is kept (0 there).

  Pure jnp, static shapes: masked positions get random sort keys, the others sort last, and the
  masked values in that random order are written back to the masked positions in index order.
  """
  if adv_bt.shape != mask_bt.shape:
    raise ValueError(f"advantages {adv_bt.shape} and mask {mask_bt.shape} differ in shape")
  a_n, m_n = adv_bt.reshape(-1), mask_bt.reshape(-1) > 0
  n = a_n.shape[0]
  src = jnp.argsort(jnp.where(m_n, jax.random.uniform(key, (n,)), 2.0))  # masked first, random order
  dst = jnp.argsort(jnp.where(m_n, jnp.arange(n) / n, 2.0))  # masked first, index order
  out = jnp.zeros_like(a_n).at[dst].set(a_n[src])  # the unmasked tails map onto each other
  return out.reshape(adv_bt.shape)
