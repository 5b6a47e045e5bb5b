"""Advantages whitened over a batch's action tokens (PPO's and verl's advantage normalisation).

GAE's advantages are TD errors against a learned critic, so their scale and their mean over a batch
are whatever the rewards and the critic's errors make them; PPO implementations (verl's
`masked_whiten` on its GAE advantages among them) subtract the batch's mean and divide by its spread
so that one learning rate fits every task. The group estimators (GRPO, MS-GRPO) normalise per group
already. The relative credit between tokens is kept.

Measured, and not what it was tried for: on delayed(cue) h8 with 16 and 32 Adam steps an update, GAE
with a pretrained critic lost the reply format (55% and 66% of the last update's turns invalid); at 16
steps its turn-0 mean advantage went from +0.08 to -0.32 in six updates. Whitened (32 steps, lr 5e-4)
it lost the format as fast: 52-61% of the turns invalid in updates 5-8, when the run was stopped.
Whitening removes any offset, so a critic's offset is not what broke the format there; a KL penalty to
the warm start kept it (docs/STUDY_ROUND3.md).
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
