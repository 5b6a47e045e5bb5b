"""Masked statistics for logging; every reduction ignores mask-0 tokens."""
import jax
import jax.numpy as jnp


def masked_mean(x, mask) -> jax.Array:
  m = mask > 0
  return jnp.sum(jnp.where(m, x, 0.0)) / jnp.maximum(jnp.sum(m), 1)


def masked_var(x, mask) -> jax.Array:
  m = mask > 0
  dev = jnp.where(m, x - masked_mean(x, mask), 0.0)
  return jnp.sum(dev * dev) / jnp.maximum(jnp.sum(m), 1)


def masked_fraction(flag, mask) -> jax.Array:
  """Fraction of mask-1 tokens where `flag` holds."""
  return masked_mean(flag.astype(jnp.float32), mask)


def explained_variance(pred, target, mask) -> jax.Array:
  """1 - Var[target - pred] / Var[target]; 0 when the targets do not vary."""
  var_t = masked_var(target, mask)
  var_r = masked_var(target - pred, mask)
  # Equivalent mutants: the guard's value is only read where var_t > 0.
  safe_t = jnp.where(var_t > 0, var_t, 1.0)  # pragma: no mutate
  return jnp.where(var_t > 0, 1.0 - var_r / safe_t, 0.0)


def per_turn_mean_std(x_bt, turn_idx_bt, mask_bt, max_turns: int):
  """Token-weighted mean and std of x for each turn index 0..max_turns-1.

  Tokens with turn index outside [0, max_turns) are left out. Turns without
  tokens report 0. Returns (mean f32[K], std f32[K], count f32[K]).
  """
  m = (mask_bt > 0) & (turn_idx_bt >= 0) & (turn_idx_bt < max_turns)
  seg = jnp.where(m, turn_idx_bt, max_turns).reshape(-1)
  w = m.reshape(-1).astype(jnp.float32)
  x = jnp.where(m, x_bt, 0.0).reshape(-1)
  n = max_turns + 1
  cnt = jax.ops.segment_sum(w, seg, num_segments=n)[:-1]
  mean = jax.ops.segment_sum(x, seg, num_segments=n)[:-1] / jnp.maximum(cnt, 1.0)
  # Equivalent mutants: a longer zero pad (index max_turns still reads 0), and
  # a fill that lands only in the dropped segment max_turns.
  mean_pad = jnp.concatenate([mean, jnp.zeros(1)])  # pragma: no mutate
  centred = x - mean_pad[seg]
  dev = jnp.where(m.reshape(-1), centred, 0.0)  # pragma: no mutate
  var = jax.ops.segment_sum(dev * dev, seg, num_segments=n)[:-1] / jnp.maximum(cnt, 1.0)
  return mean, jnp.sqrt(var), cnt
