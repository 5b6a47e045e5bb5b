"""Advantages whitened over a batch's action tokens (PPO's and verl's advantage normalisation).

GAE's advantages are TD errors against a learned critic, so their mean over a batch is whatever the
critic's error is: when the policy starts to make mistakes the critic has not yet seen (the format
penalty of an invalid reply), the critic over-values every state and the mean advantage turns
negative on every turn at once. A negative mean pushes down the probability of every sampled token
(not only the wrong ones) and so raises the entropy, which makes more invalid replies: measured on
delayed(cue) h8 with 16-32 Adam steps an update, the mean advantage of turns 0-1 went from +0.08 to
-0.32 in five updates while 53-66% of the turns went invalid (docs/STUDY_ROUND3.md). The group
estimators (GRPO, MS-GRPO) subtract a group mean already. Whitening subtracts the batch's mean and
divides by its spread, so the update pushes up the better half of the batch's tokens and down the
worse half whatever the critic's offset; the relative credit between tokens is kept. verl applies
the same `masked_whiten` to its GAE advantages.
"""
import jax
import jax.numpy as jnp

EPS = 1e-8


def masked_whiten(adv_bt: jax.Array, mask_bt: jax.Array, eps: float = EPS) -> jax.Array:
  """(adv - mean) / sqrt(var + eps) over the tokens where mask_bt > 0; exactly 0 elsewhere.

  Mean and (population) variance are over the masked tokens only, each token counted once. A batch
  whose masked advantages are all equal comes out as zeros (no direction to push), not NaN; a batch
  with no masked token comes out as zeros.
  """
  m = (mask_bt > 0).astype(jnp.float32)
  # Shifted by one masked value first, so a constant batch is exactly 0 after the shift (a float32
  # sum / n of equal values is not exact, and the residual over sqrt(eps) reads as a push of ~0.02).
  pivot = adv_bt.reshape(-1)[jnp.argmax(m.reshape(-1))].astype(jnp.float32)
  x = adv_bt.astype(jnp.float32) - pivot
  n = jnp.maximum(m.sum(), 1.0)
  mean = (x * m).sum() / n
  var = (jnp.square(x - mean) * m).sum() / n
  return jnp.where(mask_bt > 0, (x - mean) * jax.lax.rsqrt(var + eps), 0.0)
