"""Per-token statistics of the next-token distribution, without [B, T, V] logits.

The learner needs, per position, log p(target), the entropy of the softmax
and (for SFT accuracy) whether the argmax is the target; never the logits
themselves. With a 152k vocabulary the fp32 logits of 4 x 8k tokens are
20 GB, and autodiff would keep them (and their softmax) for the backward pass.

`token_stats` therefore walks the sequence in chunks of `chunk` positions:
a `lax.scan` whose body projects one chunk's hidden states to [B, chunk, V]
logits, reduces them to three [B, chunk] arrays, and is wrapped in
`jax.checkpoint`, so the backward pass recomputes one chunk's logits at a
time instead of storing all of them. Peak logits memory is B * chunk * V
floats whatever T is. `chunk=0` computes all T positions at once (same
numbers; the simple path for small vocabularies).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from mtrl_jax.models.transformer import Transformer, project_logits


class TokenStats(NamedTuple):
  """Per-position statistics, f32[B, T] each (targets at the same positions)."""
  logp_bt: jax.Array  # log p(target); differentiable
  entropy_bt: jax.Array  # entropy of the softmax; differentiable
  correct_bt: jax.Array  # 1.0 where argmax == target (no gradient)


def _stats(h_btd, w_dv, targets_bt) -> TokenStats:
  logits = project_logits(h_btd, w_dv)
  logp_btv = jax.nn.log_softmax(logits, axis=-1)
  logp = jnp.take_along_axis(logp_btv, targets_bt[..., None], axis=-1)[..., 0]
  ent = -jnp.sum(jnp.exp(logp_btv) * logp_btv, axis=-1)
  correct = jax.lax.stop_gradient((jnp.argmax(logits, axis=-1) == targets_bt).astype(jnp.float32))
  return TokenStats(logp, ent, correct)


def chunked_token_stats(h_btd: jax.Array, w_dv: jax.Array, targets_bt: jax.Array,
                        chunk: int = 0) -> TokenStats:
  """TokenStats of logits = h @ W, `chunk` positions at a time (0 = all at once).

  T need not be a multiple of `chunk`: the tail chunk is padded and the
  padding's outputs are cut off (they never reach a loss, so no gradient).
  """
  if chunk < 0:
    raise ValueError(f"chunk must be >= 0, got {chunk}")
  b, t, d = h_btd.shape
  if chunk == 0 or chunk >= t:
    return _stats(h_btd, w_dv, targets_bt)
  n = -(-t // chunk)
  pad = n * chunk - t
  h = jnp.pad(h_btd, ((0, 0), (0, pad), (0, 0)))
  y = jnp.pad(targets_bt, ((0, 0), (0, pad)))
  # Chunk axis first for the scan: [n, B, chunk, ...].
  h = h.reshape(b, n, chunk, d).transpose(1, 0, 2, 3)
  y = y.reshape(b, n, chunk).transpose(1, 0, 2)

  # Saving nothing but the body's inputs (h chunk, W, targets) is what keeps
  # the backward pass from storing every chunk's [B, chunk, V] logits.
  @jax.checkpoint
  def body(h_c, y_c):
    return _stats(h_c, w_dv, y_c)

  def step(carry, xs):
    return carry, body(*xs)

  _, out = jax.lax.scan(step, None, (h, y))
  return TokenStats(*(a.transpose(1, 0, 2).reshape(b, n * chunk)[:, :t] for a in out))


def token_stats(model: Transformer, h_btd: jax.Array, targets_bt: jax.Array) -> TokenStats:
  """TokenStats of a policy's hidden states, chunked as `model.cfg.logits_chunk` says."""
  return chunked_token_stats(h_btd, model.unembedding(), targets_bt, model.cfg.logits_chunk)
