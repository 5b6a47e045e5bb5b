"""High-entropy ("forking") token selection, arXiv 2506.01939."""
from fractions import Fraction

import jax
import jax.numpy as jnp

_MAX_DENOMINATOR = 10_000


def ceil_fraction_of(rho: float, n: jax.Array) -> jax.Array:
  """ceil(rho * n) in exact integer arithmetic.

  rho is read as the nearest fraction p/q with q <= 10000 (exact for any
  rho with at most four decimals); n may be a traced int.
  """
  if not 0.0 <= rho <= 1.0:
    raise ValueError(f"rho must lie in [0, 1], got {rho!r}")
  frac = Fraction(rho).limit_denominator(_MAX_DENOMINATOR)
  p, q = frac.numerator, frac.denominator
  # Equivalent mutants: without the dtype a count is int32 already (int64 with
  # x64, the same arithmetic).
  n = jnp.asarray(n, jnp.int32)  # pragma: no mutate
  return (n // q) * p + ((n % q) * p + q - 1) // q


def high_entropy_mask(entropy_bt: jax.Array, mask_bt: jax.Array,
                      rho: float = 0.2) -> jax.Array:
  """Keeps the ceil(rho * N) highest-entropy tokens among the N valid ones.

  Batch-wide: the ranking spans every valid token of every row. Ties are
  broken by position in row-major order (the earlier token is kept), so the
  result is deterministic. Returns bool[B, T], False wherever mask is 0.
  """
  m = (mask_bt > 0).reshape(-1)
  ent = jax.lax.stop_gradient(entropy_bt).reshape(-1)
  key = jnp.where(m, -ent, jnp.inf)  # ascending sort = descending entropy
  order = jnp.argsort(key, stable=True)
  rank = jnp.zeros(key.shape, jnp.int32).at[order].set(
      jnp.arange(key.shape[0], dtype=jnp.int32))
  keep = ceil_fraction_of(rho, jnp.sum(m))
  return ((rank < keep) & m).reshape(entropy_bt.shape)
